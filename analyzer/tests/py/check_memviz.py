"""Checks a memory_viz pickle the way PyTorch's viewer reads it.

1. Every opcode is in MemoryViz.js's unpickle() whitelist (no LONG4, bytes, globals...), and
   no LONG1 is longer than 8 bytes (those become JS BigInts).
2. pickle.loads gives the snapshot structure (segments, device_traces, entries' keys), frees
   come as free_requested + free_completed pairs, and the final segments match the trace.
3. If torch is importable, PyTorch's own torch.cuda._memory_viz functions run on it.
Prints 'torch: skipped (...)' when torch is not installed.
"""
import pickle
import pickletools
import os
import sys

ALLOWED = {
    "PROTO", "FRAME", "MARK", "STOP", "EMPTY_DICT", "DICT", "SETITEM", "SETITEMS",
    "EMPTY_LIST", "LIST", "APPEND", "APPENDS", "EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2",
    "TUPLE3", "BININT", "BININT1", "BININT2", "LONG1", "BINFLOAT", "NEWTRUE", "NEWFALSE",
    "NONE", "SHORT_BINUNICODE", "BINUNICODE", "MEMOIZE", "BINPUT", "LONG_BINPUT", "BINGET",
    "LONG_BINGET",
}

path = sys.argv[1]
data = open(path, "rb").read()
for op, arg, pos in pickletools.genops(data):
    assert op.name in ALLOWED, f"opcode {op.name} at {pos} is not accepted by MemoryViz"
    if op.name == "LONG1":
        assert data[pos + 1] <= 8, f"LONG1 of {data[pos + 1]} bytes at {pos} (a JS BigInt)"

snap = pickle.loads(data)
assert isinstance(snap, dict), type(snap)
assert isinstance(snap["segments"], list)
assert isinstance(snap["device_traces"], list)
live = {}
for dev, trace in enumerate(snap["device_traces"]):
    pending = set()
    for i, e in enumerate(trace):
        a = e["action"]
        assert a in ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom"), a
        for k in ("size", "stream", "time_us"):
            assert isinstance(e[k], int), (i, k)
        if a == "oom":
            assert isinstance(e["device_free"], int)
            continue
        addr = e["addr"]
        if a == "alloc":
            assert trace[i - 1]["action"] == "segment_alloc" and trace[i - 1]["addr"] == addr
            live[(dev, addr)] = e["size"]
            assert isinstance(e["frames"], list)
        elif a == "free_requested":
            pending.add(addr)
        elif a == "free_completed":
            assert addr in pending, f"free_completed without free_requested at {i}"
            pending.discard(addr)
            del live[(dev, addr)]
    assert not pending
segs = {(s["device"], s["address"]): s for s in snap["segments"]}
assert set(segs) == set(live), "final segments must be the live set"
for k, s in segs.items():
    assert s["total_size"] == live[k]
    assert sum(b["size"] for b in s["blocks"]) == s["total_size"]
    assert all(b["state"] == "active_allocated" for b in s["blocks"])
    assert isinstance(s["segment_pool_id"], tuple)
# The categories quirk: no entry has a category.
assert not any("category" in e for t in snap["device_traces"] for e in t)
print(f"pickle ok: {sum(len(t) for t in snap['device_traces'])} entries, {len(segs)} live segments")

try:
    import torch  # noqa: F401
    from torch.cuda import _memory_viz as mv
except Exception as e:  # torch is large and optional, except where CI installed it
    if os.environ.get("VRAMSHIM_REQUIRE_VIEWERS") == "1":
        print(f"torch: VRAMSHIM_REQUIRE_VIEWERS=1 but torch is not importable: {e!r}")
        sys.exit(1)
    print(f"torch: skipped (torch not importable: {e.__class__.__name__})")
    sys.exit(0)
import io
import contextlib


def lines_only(flamegraph_lines, flamegraph_script=None):
    # memory_viz's own format_flamegraph downloads flamegraph.pl from the network; the
    # snapshot walk that produces its input lines is what reads our records.
    return flamegraph_lines


buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    print(mv.segsum(snap))
    print(mv.trace(snap))
seg_lines = mv.segments(snap, format_flamegraph=lines_only)
mem_lines = mv.memory(snap, format_flamegraph=lines_only)
assert isinstance(seg_lines, str) and isinstance(mem_lines, str)
blocks = sum(len(s["blocks"]) for s in snap["segments"])
assert len(seg_lines.splitlines()) >= blocks, (len(seg_lines.splitlines()), blocks)
plot = mv.trace_plot(snap)
seg_plot = mv.segment_plot(snap)
assert isinstance(plot, str) and len(plot) > 1000 and isinstance(seg_plot, str) and len(seg_plot) > 1000
print(
    "torch: _memory_viz.segsum/trace/segments/memory/trace_plot/segment_plot ok "
    f"(torch {torch.__version__}; {len(seg_lines.splitlines())} segment lines, "
    f"trace_plot {len(plot)} B)"
)
