#!/usr/bin/env python3
"""Cost of Python frames in call stacks, by Python depth (docs/benchmarks.md, "Python frames
in call stacks"), side by side with the tensor-level route, and the training step with
tensor-level events on.

Native route (any Python program; here ctypes, which releases the GIL like PyTorch's
operators): `cudaMalloc(64 KiB)` + `cudaFree` pairs through the simulated runtime, called at
Python depth D (D nested calls, plus 5 frames of this harness, on the stack), under `vramshim run --sim --trace
--stacks 16`, in two configurations alternating:
  native:  VRAMSHIM_PY_STACKS=0 (native frames only: the baseline)
  python:  Python frames merged in (the default)
Tensor-level route (PyTorch's caching allocator): `torch.empty(200 KiB)` + `del` pairs at
depth D, under `vramshim run --sim --trace`:
  segment: --no-python-hook (the baseline)
  tensor:  the hook as loaded by default (tracker + PyTorch's own Python-stack capture)
Each figure is the CPU time of the calling thread per pair (PAIRS pairs, best of 5 inside the
job), best over ROUNDS alternating runs. The added cost is the difference to the baseline.

Training step: CPU time of the whole process per step of a small MLP with AdamW (segment vs
tensor), the median of 5 repetitions of STEPS steps inside each job; the jobs alternate for
--step-rounds rounds; prints each round's ratio, their median and spread.

Usage: bench_pyframes.py --vramshim PATH --python TORCH_PYTHON [--rounds N] [--step-rounds N]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

DEPTHS = tuple(int(d) for d in os.environ.get("BENCH_DEPTHS", "1,4,16,64").split(","))
PAIRS = int(os.environ.get("BENCH_PAIRS", "20000"))
TENSOR_PAIRS = int(os.environ.get("BENCH_TENSOR_PAIRS", "10000"))
STEPS = int(os.environ.get("BENCH_STEPS", "100"))
STEP_REPS = int(os.environ.get("BENCH_STEP_REPS", "5"))


def nest(d, f, *a):
    # d Python frames of nest() under f, plus f's own.
    if d <= 1:
        return f(*a)
    return nest(d - 1, f, *a)


def best_of(fn, n, reps=5):
    fn(n // 10)
    best = None
    for _ in range(reps):
        t = time.thread_time_ns()
        fn(n)
        ns = (time.thread_time_ns() - t) / n
        best = ns if best is None else min(best, ns)
    return best


def native_job(cudart):
    import ctypes

    rt = ctypes.CDLL(cudart)
    rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    rt.cudaFree.argtypes = [ctypes.c_void_p]
    p = ctypes.c_void_p()
    ref = ctypes.byref(p)
    malloc, free = rt.cudaMalloc, rt.cudaFree

    def pairs(n):
        for _ in range(n):
            malloc(ref, 65536)
            free(p)

    out = {}
    for d in DEPTHS:
        out["d%d" % d] = best_of(lambda n: nest(d, pairs, n), PAIRS)
    print("BENCH " + json.dumps(out), flush=True)


def tensor_job():
    import torch

    torch.empty(1, device="cuda")

    def pairs(n):
        for _ in range(n):
            x = torch.empty(200 << 10, dtype=torch.uint8, device="cuda")
            del x

    out = {}
    for d in DEPTHS:
        out["d%d" % d] = best_of(lambda n: nest(d, pairs, n), TENSOR_PAIRS)
    print("BENCH " + json.dumps(out), flush=True)


def step_job():
    import torch

    from mlp_step import mlp_step

    step = mlp_step(torch)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    reps = []
    for _ in range(STEP_REPS):
        t = time.process_time_ns()
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
        reps.append((time.process_time_ns() - t) / STEPS / 1e6)
    print("BENCH " + json.dumps({"step_ms": statistics.median(reps)}), flush=True)


def run(a, d, name, flags, env_extra, job_args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMSHIM_")}
    env.update(VRAMSIM_NAME="bench-pyframes-%d" % os.getpid(), VRAMSIM_CONTEXT_OVERHEAD="0",
               PYTHONWARNINGS="ignore", **env_extra)
    trace = os.path.join(d, name + ".vramtrace")
    p = subprocess.run(
        [a.vramshim, "run", "--sim", "--trace", trace] + flags
        + ["--", a.python, __file__] + job_args,
        env=env, capture_output=True, text=True)
    line = [l for l in p.stdout.splitlines() if l.startswith("BENCH ")]
    if p.returncode != 0 or not line:
        sys.exit("bench run %s failed (%d):\n%s%s" % (name, p.returncode, p.stdout, p.stderr))
    os.unlink(trace)
    return json.loads(line[0][6:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vramshim", required=True)
    ap.add_argument("--python", required=True)
    ap.add_argument("--cudart", default=os.path.join(
        os.path.dirname(os.path.abspath(sys.argv[0])), "..", "..", "..", "target", "release",
        "cuda-sim", "libcudart.so.12"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--step-rounds", type=int, default=8)
    a = ap.parse_args()
    stacks = ["--stacks", "16"]
    confs = {
        "native": (stacks, {"VRAMSHIM_PY_STACKS": "0"}, ["--native-job", a.cudart]),
        "python": (stacks, {}, ["--native-job", a.cudart]),
        "segment": (["--no-python-hook"], {}, ["--tensor-job"]),
        "tensor": ([], {}, ["--tensor-job"]),
    }
    best = {c: {} for c in confs}
    steps = []
    with tempfile.TemporaryDirectory() as d:
        for r in range(a.rounds):
            for c, (flags, env, args) in confs.items():
                for k, v in run(a, d, "%s-%d" % (c, r), flags, env, args).items():
                    best[c][k] = min(v, best[c].get(k, v))
        for r in range(a.step_rounds):
            s = run(a, d, "seg-step-%d" % r, ["--no-python-hook"], {}, ["--step-job"])
            t = run(a, d, "ten-step-%d" % r, [], {}, ["--step-job"])
            steps.append((s["step_ms"], t["step_ms"]))
    print("| route | configuration | " + " | ".join("depth %d (ns)" % d for d in DEPTHS) + " |")
    print("| --- | --- |" + " ---: |" * len(DEPTHS))
    for route, base, conf in (("native", "native", "native"), ("native", "native", "python"),
                              ("tensor", "segment", "segment"), ("tensor", "segment", "tensor")):
        cells = []
        for d in DEPTHS:
            k = "d%d" % d
            v, b = best[conf][k], best[base][k]
            cells.append("%.0f" % v if conf == base else "%.0f (%+.0f)" % (v, v - b))
        print("| %s | %s | %s |" % (route, conf, " | ".join(cells)))
    print()
    ratios = [100.0 * (t / s - 1) for s, t in steps]
    for (s, t), r in zip(steps, ratios):
        print("step: segment %.3f ms, tensor %.3f ms: %+.1f%%" % (s, t, r))
    if ratios:  # --step-rounds 0: the timings by depth alone
        print("step: median %+.1f%%, spread %+.1f%% .. %+.1f%% over %d rounds" % (
            statistics.median(ratios), min(ratios), max(ratios), len(ratios)))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--native-job":
        native_job(sys.argv[2])
    elif len(sys.argv) == 2 and sys.argv[1] == "--tensor-job":
        tensor_job()
    elif len(sys.argv) == 2 and sys.argv[1] == "--step-job":
        step_job()
    else:
        main()
