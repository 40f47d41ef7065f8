#!/usr/bin/env python3
"""Replay an RMM CSV allocation log through PyTorch's CUDA allocator.

Every `allocate` row becomes `torch.empty(size, dtype=torch.uint8, device="cuda")` and every
`free` row drops that tensor (`del`), in file order on one thread, under whatever
PYTORCH_CUDA_ALLOC_CONF / PYTORCH_NO_CUDA_MEMORY_CACHING the caller set. PyTorch's allocator
runs for real: on a GPU, or on the simulated one (cuda-sim) where kernels are not computed,
so this script launches none: patterns are written with host-to-device copies (`.copy_` of a
CPU tensor) and read back with device-to-host copies (`.cpu()`).

Output: stdout ends with exactly one JSON line (keys in docs/pytorch.md), stderr gets one line
per problem. Exit status: 0 every allocation succeeded and every pattern matched; 2 an
allocation failed: PyTorch raised torch.OutOfMemoryError, or another error (the replay stops
there; "oom" in the JSON names the exception's type); 1 pattern mismatch or bad input.
"""

import argparse
import csv
import json
import os
import sys
import time

import torch

PATTERN_SAMPLE = 4096  # bytes checked at each end of a block with --pattern=sample


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", help="RMM logging CSV (Thread,Time,Action,Pointer,Size,Stream)")
    p.add_argument(
        "--pattern",
        choices=["none", "sample", "full"],
        default="none",
        help="write a per-block pattern after each allocation and check it before each free "
        "(sample: the first and last 4 KiB of each block; full: every byte)",
    )
    p.add_argument("--limit", type=int, default=0, help="replay only the first N rows")
    p.add_argument("--repeat", type=int, default=1, help="replay the log N times")
    p.add_argument("--device", type=int, default=0, help="CUDA device ordinal")
    p.add_argument(
        "--marks",
        action="store_true",
        help="print 'replay_torch: mark pass=P half=H' to stderr before the first allocation of "
        "each half of each pass, and 'replay_torch: mark end' after the replay (to split a "
        "driver call log into phases; no CUDA call)",
    )
    p.add_argument(
        "--empty-cache-at-end",
        action="store_true",
        help="call torch.cuda.empty_cache() after the replay (stats are taken before)",
    )
    return p.parse_args(argv)


def read_trace(path, limit):
    """[(is_alloc, pointer, size)] in file order."""
    rows = []
    with open(path, newline="") as f:
        r = csv.reader(f)
        header = next(r, None)
        if header is None:
            raise ValueError(f"{path}: empty file")
        cols = {name.strip().lower(): i for i, name in enumerate(header)}
        for need in ("action", "pointer", "size"):
            if need not in cols:
                raise ValueError(f"{path}:1: no {need!r} column (RMM CSV header expected)")
        ia, ip, isz = cols["action"], cols["pointer"], cols["size"]
        for lineno, row in enumerate(r, start=2):
            if not row:
                continue
            action = row[ia].strip().lower()
            if action.startswith("allocate fail"):
                # A request the recorded run was refused (pointer "(nil)"): nothing to replay.
                continue
            try:
                ptr = int(row[ip], 16)
                size = int(row[isz])
            except (ValueError, IndexError):
                raise ValueError(f"{path}:{lineno}: bad row {row!r}") from None
            if action == "allocate":
                rows.append((True, ptr, size))
            elif action == "free":
                rows.append((False, ptr, size))
            else:
                raise ValueError(f"{path}:{lineno}: unknown action {row[ia]!r}")
            if limit and len(rows) >= limit:
                break
    return rows


class Patterns:
    """Per-block byte patterns, written and checked with copies only (no kernels)."""

    def __init__(self, mode):
        self.mode = mode
        self.cache = {}

    def _host(self, seed, n):
        key = (seed % 251, n)
        t = self.cache.get(key)
        if t is None:
            # (i * 131 + seed) mod 251: differs between neighbouring blocks and positions.
            t = ((torch.arange(n, dtype=torch.int64) * 131 + seed) % 251).to(torch.uint8)
            if len(self.cache) > 64:
                self.cache.clear()
            self.cache[key] = t
        return t

    def ranges(self, size):
        if self.mode == "full" or size <= 2 * PATTERN_SAMPLE:
            return [(0, size)]
        return [(0, PATTERN_SAMPLE), (size - PATTERN_SAMPLE, PATTERN_SAMPLE)]

    def write(self, t, seed):
        for off, n in self.ranges(t.numel()):
            t[off : off + n].copy_(self._host(seed + off, n))

    def check(self, t, seed):
        for off, n in self.ranges(t.numel()):
            if not torch.equal(t[off : off + n].cpu(), self._host(seed + off, n)):
                return False
        return True


def stat(stats, key, default=None):
    v = stats.get(key)
    return int(v) if v is not None else default


def main(argv):
    a = parse_args(argv)
    try:
        rows = read_trace(a.trace, a.limit)
    except (OSError, ValueError) as e:
        print(f"replay_torch: {e}", file=sys.stderr)
        return 1

    out = {
        "driver": "pytorch",
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", os.environ.get("PYTORCH_ALLOC_CONF", "")),
        "no_caching": os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "") not in ("", "0"),
        "trace": a.trace,
        "pattern": a.pattern,
    }
    if not torch.cuda.is_available():
        out.update(completed=False, error="torch.cuda.is_available() is False")
        print(json.dumps(out))
        print("replay_torch: torch.cuda.is_available() is False", file=sys.stderr)
        return 1
    torch.cuda.set_device(a.device)
    out["backend"] = torch.cuda.get_allocator_backend()
    out["device_total"] = torch.cuda.get_device_properties(a.device).total_memory
    torch.cuda.reset_peak_memory_stats(a.device)

    patterns = Patterns(a.pattern) if a.pattern != "none" else None
    live = {}  # trace pointer -> (tensor, seed)
    live_bytes = peak_live = 0
    allocs = frees = skipped = mismatches = events = 0
    oom = None
    # allocation index (per pass) at which each half starts
    half = {0: 1, (sum(1 for r in rows if r[0]) + 1) // 2: 2}
    started = time.monotonic_ns()
    for rep in range(max(1, a.repeat)):
        if rep:
            live.clear()
            live_bytes = 0
        pass_allocs = 0
        for i, (is_alloc, ptr, size) in enumerate(rows):
            event = rep * len(rows) + i
            events += 1
            if is_alloc:
                if a.marks and pass_allocs in half:
                    print(f"replay_torch: mark pass={rep + 1} half={half[pass_allocs]}", file=sys.stderr, flush=True)
                pass_allocs += 1
                try:
                    t = torch.empty(size, dtype=torch.uint8, device="cuda")
                except RuntimeError as e:
                    # torch.OutOfMemoryError (PyTorch's allocator gave up), or another CUDA
                    # error raised by the allocation (e.g. torch.AcceleratorError when a
                    # runtime call under PyTorch's no-caching path fails).
                    msg = str(e)
                    oom = {
                        "event": event,
                        "size": size,
                        "live_bytes": live_bytes,
                        "type": type(e).__name__,
                        "message": msg,
                    }
                    print(f"replay_torch: event {event}: alloc {size} failed: {msg.splitlines()[0]}", file=sys.stderr)
                    break
                allocs += 1
                if patterns is not None and size:
                    patterns.write(t, event)
                if ptr in live:
                    # The log reused a pointer without freeing it: drop the older block.
                    live_bytes -= live[ptr][0].numel()
                live[ptr] = (t, event)
                live_bytes += size
                peak_live = max(peak_live, live_bytes)
            else:
                entry = live.pop(ptr, None)
                if entry is None:
                    skipped += 1
                    continue
                t, seed = entry
                if patterns is not None and t.numel() and not patterns.check(t, seed):
                    mismatches += 1
                    print(
                        f"replay_torch: event {event}: pattern mismatch in block of {t.numel()} bytes at 0x{t.data_ptr():x} (allocated at event {seed})",
                        file=sys.stderr,
                    )
                live_bytes -= t.numel()
                frees += 1
                del t, entry
        if oom is not None:
            break
    if a.marks:
        print("replay_torch: mark end", file=sys.stderr, flush=True)
    if patterns is not None and oom is None:
        for t, seed in live.values():
            if t.numel() and not patterns.check(t, seed):
                mismatches += 1
                print(f"replay_torch: pattern mismatch in block of {t.numel()} bytes live at the end", file=sys.stderr)
    torch.cuda.synchronize()
    ns = time.monotonic_ns() - started

    s = torch.cuda.memory_stats(a.device)
    # what the device says is free and its size (cudaMemGetInfo), with the last row's tensors
    # still live: under vramshim's pool the pool's pages count as used
    free, total = torch.cuda.mem_get_info(a.device)
    out.update(
        completed=oom is None,
        events=events,
        allocs=allocs,
        frees=frees,
        skipped_frees=skipped,
        live_at_end=len(live),
        peak_live=peak_live,
        max_memory_reserved=torch.cuda.max_memory_reserved(a.device),
        max_memory_allocated=torch.cuda.max_memory_allocated(a.device),
        memory_reserved=torch.cuda.memory_reserved(a.device),
        num_alloc_retries=stat(s, "num_alloc_retries", 0),
        num_ooms=stat(s, "num_ooms", 0),
        # cudaMalloc / cudaFree calls of the native allocator (segments; with expandable
        # segments: growths by mapping), None where the backend does not count them.
        num_device_alloc=stat(s, "num_device_alloc"),
        num_device_free=stat(s, "num_device_free"),
        segments_allocated=stat(s, "segment.all.allocated"),
        segments_peak=stat(s, "segment.all.peak"),
        mem_get_info_free=free,
        mem_get_info_total=total,
        mismatches=mismatches,
        oom=oom,
        ns=ns,
    )
    live.clear()
    if a.empty_cache_at_end:
        torch.cuda.empty_cache()
    print(json.dumps(out), flush=True)
    if mismatches:
        return 1
    return 2 if oom is not None else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
