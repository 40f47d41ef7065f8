#!/usr/bin/env python3
"""PyTorch's allocators vs vramshim's stitch pool on the simulated GPU (scripts/bench pytorch).

For each trace and configuration (PyTorch default, expandable_segments:True,
backend:cudaMallocAsync, vramshim --pool stitch which sets PYTORCH_NO_CUDA_MEMORY_CACHING=1):
  * one run on a 16 GiB simulated device with the driver's call log on (VRAMSIM_DEBUG=1):
    peak device use (the simulated device's own high-water mark, context overhead 0),
    PyTorch's max_memory_reserved, memory-management driver calls and device syncs
    (cuCtx/Stream/EventSynchronize, cuMemFree) per 1000 allocations;
  * the smallest simulated device (2 MiB steps, bisection) on which the replay completes.
Prints one markdown table. Usage:
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
    ("vramshim stitch", {}, ["--pool", "stitch"]),
]
MEM = ("cuMemAlloc", "cuMemFree", "cuMemCreate", "cuMemRelease", "cuMemMap", "cuMemUnmap",
       "cuMemSetAccess", "cuMemAddressReserve", "cuMemAddressFree")
SYNC = ("cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize", "cuMemFree")


def base_name(name):
    name = name.removesuffix("_ptsz").removesuffix("_ptds")
    return re.sub(r"_v\d+$", "", name)


def driver_counts(stderr):
    calls = syncs = 0
    for line in stderr.splitlines():
        m = re.match(r"vramsim: (\w+) -> ", line)
        if not m:
            continue
        b = base_name(m.group(1))
        if b.startswith(("cuMemFreeHost", "cuMemAllocHost")):
            continue
        if any(b in (x, x + "Async", x + "Pitch", x + "Managed", x + "FromPoolAsync") for x in MEM):
            calls += 1
        if b in SYNC:
            syncs += 1
    return calls, syncs


class Runner:
    def __init__(self, a):
        self.a = a
        self.n = 0

    def run(self, trace, env_extra, flags, memory, debug=False):
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
               os.path.join(HERE, "replay_torch.py"), trace]
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
    r = Runner(a)
    print("| trace | configuration | smallest device MiB | / peak live | peak device use MiB | "
          "PyTorch max reserved MiB | driver calls / 1000 allocs | syncs / 1000 allocs |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for trace in traces:
        for label, env_extra, flags in CONFIGS:
            ok, j, stderr, hw = r.run(trace, env_extra, flags, 16 << 30, debug=True)
            if not ok:
                print(f"| {os.path.basename(trace)} | {label} | failed on 16 GiB | | | | | |", flush=True)
                continue
            calls, syncs = driver_counts(stderr)
            allocs = max(1, j["allocs"])
            live = j["peak_live"]
            need = smallest(r, trace, env_extra, flags, live - 1, max(hw, live))
            print(f"| {os.path.basename(trace)} | {label} | {need / MIB:.0f} | {need / live:.3f} | "
                  f"{hw / MIB:.0f} | {j['max_memory_reserved'] / MIB:.0f} | "
                  f"{calls * 1000 / allocs:.1f} | {syncs * 1000 / allocs:.1f} |", flush=True)
    print(f"\n(peak live: the largest sum of live requested bytes of the trace; {r.n} runs)")


if __name__ == "__main__":
    main()
