#!/usr/bin/env python3
"""PyTorch's allocators vs vramshim's stitch pool on the simulated GPU (scripts/bench pytorch).

For each trace and configuration (PyTorch default, expandable_segments:True,
backend:cudaMallocAsync; vramshim --pool stitch with PyTorch uncached, i.e.
PYTORCH_NO_CUDA_MEMORY_CACHING=1 (--pytorch-route uncached): cudaMalloc/cudaFree per tensor; and
vramshim --pool stitch behind PyTorch's backend:cudaMallocAsync: cudaMallocAsync/cudaFreeAsync
per tensor):
  * one run on a 16 GiB simulated device: peak device use (the simulated device's own
    high-water mark, context overhead 0) and PyTorch's max_memory_reserved;
  * one run on a 16 GiB device replaying the trace twice (--repeat 2) with the driver's call
    log on (VRAMSIM_DEBUG=1) and replay_torch.py's phase marks: memory-management driver calls
    and device syncs (cuCtx/Stream/EventSynchronize, cuMemFree) per 1000 allocations, for the
    first pass (start-up included), the second half of the first pass, and the second pass
    (the steady state of a repeating workload);
  * the smallest simulated device (2 MiB steps, bisection) on which one pass completes.
Prints one markdown table. BENCH_TORCH_CONFIGS: comma-separated configuration numbers (1-5)
for a subset. Usage:
  bench_torch.py --vramshim PATH --smi PATH --python TORCH_PYTHON [TRACE...]
"""

import argparse
import json
import os
import re
import subprocess
import sys

MIB = 1 << 20
STEP = 2 * MIB
HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = [
    ("PyTorch default", {}, []),
    ("expandable_segments:True", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, []),
    ("backend:cudaMallocAsync", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, []),
    ("stitch, PyTorch uncached", {}, ["--pool", "stitch", "--pytorch-route", "uncached"]),
    ("stitch behind backend:cudaMallocAsync",
     {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, ["--pool", "stitch"]),
]
MEM = ("cuMemAlloc", "cuMemFree", "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap",
       "cuMemSetAccess", "cuMemAddressReserve", "cuMemAddressFree")
SYNC = ("cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize", "cuMemFree")


def base_name(name):
    name = name.removesuffix("_ptsz").removesuffix("_ptds")
    return re.sub(r"_v\d+$", "", name)


def driver_counts(stderr):
    """{phase: (calls, syncs)}; phases: 'start' (before the first mark), (pass, half), 'end'."""
    counts = {}
    phase = "start"
    for line in stderr.splitlines():
        m = re.match(r"replay_torch: mark (?:pass=(\d+) half=(\d+)|(end))$", line)
        if m:
            phase = "end" if m.group(3) else (int(m.group(1)), int(m.group(2)))
            continue
        m = re.match(r"vramsim: (\w+) -> ", line)
        if not m:
            continue
        b = base_name(m.group(1))
        if b.startswith(("cuMemFreeHost", "cuMemAllocHost")):
            continue
        c, s = counts.get(phase, (0, 0))
        if any(b in (x, x + "Async", x + "Pitch", x + "Managed", x + "FromPoolAsync") for x in MEM):
            c += 1
        if b in SYNC:
            s += 1
        counts[phase] = (c, s)
    return counts


def phase_rates(counts, allocs_per_pass):
    """Per 1000 allocations: (calls, syncs) of the first pass (start-up included), of the
    second half of the first pass, and of the second pass."""
    def total(*phases):
        return tuple(sum(counts.get(p, (0, 0))[i] for p in phases) for i in (0, 1))
    n = max(1, allocs_per_pass)
    second_half = max(1, n - (n + 1) // 2)
    rates = []
    for (c, s), k in ((total("start", (1, 1), (1, 2)), n), (total((1, 2)), second_half),
                      (total((2, 1), (2, 2)), n)):
        rates.append((c * 1000 / k, s * 1000 / k))
    return rates


class Runner:
    def __init__(self, a):
        self.a = a
        self.n = 0

    def run(self, trace, env_extra, flags, memory, debug=False, extra=()):
        """(completed, json, stderr, device high water)."""
        self.n += 1
        name = f"bench-torch-{os.getpid()}-{self.n}"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("VRAMSIM_", "VRAMSHIM_", "PYTORCH_")) and k != "LD_PRELOAD"}
        env.update(env_extra)
        env.update(VRAMSIM_NAME=name, VRAMSIM_CONTEXT_OVERHEAD="0", PYTHONWARNINGS="ignore")
        if debug:
            env["VRAMSIM_DEBUG"] = "1"
        cmd = [self.a.vramshim, "run", f"--sim={memory}", *flags, "--", self.a.python,
               os.path.join(HERE, "replay_torch.py"), trace, *extra]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        j = None
        for line in reversed(p.stdout.splitlines()):
            if line.startswith("{"):
                j = json.loads(line)
                break
        hw = 0
        s = subprocess.run([self.a.smi, name], capture_output=True, text=True)
        if s.returncode == 0:
            hw = json.loads(s.stdout)["high_water"][0]
        subprocess.run([self.a.smi, "--remove", name], capture_output=True)
        ok = p.returncode == 0 and j is not None and j.get("completed")
        if j is None and p.returncode not in (0, 2):
            print(f"bench_torch: {trace} {flags} {env_extra} at {memory} B: exit {p.returncode}\n{p.stderr[-2000:]}",
                  file=sys.stderr)
        return ok, j, p.stderr, hw


def smallest(r, trace, env_extra, flags, lo, hi):
    """Smallest multiple of 2 MiB in (lo, hi] on which the replay completes (hi completes)."""
    lo, hi = lo // STEP, -(-hi // STEP)
    # One probe at 1.05 x the lower bound first (the target): saves most of the steps when
    # the high-water mark of a 16 GiB run (hi) is a cache far above the need.
    probe = -(-(lo * STEP * 21 // 20) // STEP)
    if lo < probe < hi:
        if r.run(trace, env_extra, flags, probe * STEP)[0]:
            hi = probe
        else:
            lo = probe
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ok, _, _, _ = r.run(trace, env_extra, flags, mid * STEP)
        if ok:
            hi = mid
        else:
            lo = mid
    return hi * STEP


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--vramshim", required=True)
    p.add_argument("--smi", required=True)
    p.add_argument("--python", required=True)
    p.add_argument("traces", nargs="*")
    a = p.parse_args()
    traces = a.traces or [os.path.join(HERE, "..", "traces", t) for t in
                          ("bert_serve.rmm.csv", "vit_train.rmm.csv", "t5_train.rmm.csv")]
    configs = list(enumerate(CONFIGS, 1))
    if os.environ.get("BENCH_TORCH_CONFIGS"):
        want = {int(x) for x in os.environ["BENCH_TORCH_CONFIGS"].split(",")}
        configs = [(i, c) for i, c in configs if i in want]
    r = Runner(a)
    print("| trace | configuration | smallest device MiB | / peak live | peak device use MiB | "
          "PyTorch max reserved MiB | driver calls / 1000 allocs: 1st pass | 2nd half of 1st pass | "
          "2nd pass | syncs / 1000 allocs: 1st pass | 2nd half of 1st pass | 2nd pass |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for trace in traces:
        for _, (label, env_extra, flags) in configs:
            ok, j, _, hw = r.run(trace, env_extra, flags, 16 << 30)
            ok2, j2, stderr, _ = r.run(trace, env_extra, flags, 16 << 30, debug=True,
                                       extra=("--repeat", "2", "--marks"))
            if not (ok and ok2):
                print(f"| {os.path.basename(trace)} | {label} | failed on 16 GiB | | | | | | | | | |",
                      flush=True)
                continue
            rates = phase_rates(driver_counts(stderr), j["allocs"])
            live = j["peak_live"]
            need = smallest(r, trace, env_extra, flags, live - 1, max(hw, live))
            calls = " | ".join(f"{c:.1f}" for c, _ in rates)
            syncs = " | ".join(f"{s:.1f}" for _, s in rates)
            print(f"| {os.path.basename(trace)} | {label} | {need / MIB:.0f} | {need / live:.3f} | "
                  f"{hw / MIB:.0f} | {j['max_memory_reserved'] / MIB:.0f} | {calls} | {syncs} |",
                  flush=True)
    print(f"\n(peak live: the largest sum of live requested bytes of the trace; {r.n} runs)")


if __name__ == "__main__":
    main()
