#!/usr/bin/env python3
"""Cost of vramshim's tensor-level events (docs/benchmarks.md, "PyTorch tensor-level events").

Runs this file itself as the job under `vramshim run --sim --trace`, in three
configurations, alternating, best of ROUNDS runs each:
  segment:   --no-python-hook (the trace at segment level; the baseline)
  tracker:   the hook, with PyTorch's Python-stack capture switched off again by the job
             (the `_record_memory_history(None)` the hook wraps): vramshim's tracker alone
  stacks:    the hook as `vramshim run` loads it: tracker + PyTorch's Python stacks
and measures inside the job, in CPU time (the machine may be loaded: wall time would measure
the other programs):
  * CPU ns of the calling thread per `torch.empty(200 KiB)` + `del` pair (PAIRS pairs after a
    warm-up, best of 5), called at Python depth 0 and 16 (DEPTH nested calls down);
  * CPU ms of the whole process (autograd's thread, vramshim's writer and drain threads
    included) per training step of a small MLP with AdamW (STEPS steps after 3 warm-up
    steps, best of 5).
Usage: bench_tensors.py --vramshim PATH --python TORCH_PYTHON [--rounds N]
Prints one markdown table.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

PAIRS = 20000
STEPS = 150


def job(mode):
    import torch

    torch.empty(1, device="cuda")  # CUDA initialized: the hook attached (when loaded)
    if mode == "tracker":
        # The hook puts its own capture back after the job's call: call what it wraps.
        rec = torch.cuda.memory._record_memory_history
        getattr(rec, "__wrapped__", rec)(None)

    def pairs(n):
        for _ in range(n):
            x = torch.empty(200 << 10, dtype=torch.uint8, device="cuda")
            del x

    def nest(d, n):
        if d == 0:
            pairs(n)
        else:
            nest(d - 1, n)

    out = {}
    for depth in (0, 16):
        nest(depth, 2000)
        best = None
        for _ in range(5):
            t = time.thread_time_ns()
            nest(depth, PAIRS)
            ns = (time.thread_time_ns() - t) / PAIRS
            best = ns if best is None else min(best, ns)
        out["pair_ns_depth%d" % depth] = best

    from mlp_step import mlp_step

    step = mlp_step(torch)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    best = None
    for _ in range(5):
        t = time.process_time_ns()
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
        ms = (time.process_time_ns() - t) / STEPS / 1e6
        best = ms if best is None else min(best, ms)
    out["step_ms"] = best
    print("BENCH " + json.dumps(out), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vramshim", required=True)
    ap.add_argument("--python", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    modes = ["segment", "tracker", "stacks"]
    best = {m: {} for m in modes}
    with tempfile.TemporaryDirectory() as d:
        for r in range(a.rounds):
            for m in modes:
                flags = ["--trace", os.path.join(d, "%s-%d.vramtrace" % (m, r))]
                if m == "segment":
                    flags.append("--no-python-hook")
                env = dict(os.environ, VRAMSIM_NAME="bench-tensors-%d" % os.getpid(),
                           VRAMSIM_CONTEXT_OVERHEAD="0", PYTHONWARNINGS="ignore")
                p = subprocess.run(
                    [a.vramshim, "run", "--sim"] + flags
                    + ["--", a.python, __file__, "--job", m],
                    env=env, capture_output=True, text=True)
                line = [l for l in p.stdout.splitlines() if l.startswith("BENCH ")]
                if p.returncode != 0 or not line:
                    sys.exit("bench run %s failed (%d):\n%s%s" % (m, p.returncode, p.stdout, p.stderr))
                for k, v in json.loads(line[0][6:]).items():
                    best[m][k] = min(v, best[m].get(k, v))
    base = best["segment"]
    print("| configuration | pair, depth 0 (ns) | pair, depth 16 (ns) | added, depth 0 | added, depth 16 | training step (ms) | added |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for m in modes:
        b = best[m]
        print("| %s | %.0f | %.0f | %+.0f | %+.0f | %.3f | %+.1f%% |" % (
            m, b["pair_ns_depth0"], b["pair_ns_depth16"],
            b["pair_ns_depth0"] - base["pair_ns_depth0"],
            b["pair_ns_depth16"] - base["pair_ns_depth16"],
            b["step_ms"], 100.0 * (b["step_ms"] / base["step_ms"] - 1)))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--job":
        job(sys.argv[2])
    else:
        main()
