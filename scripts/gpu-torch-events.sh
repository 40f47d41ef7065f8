#!/usr/bin/env bash
# PyTorch tensor-level events on a real GPU, with the PyTorch of the system's python3:
#   1. prints torch's version, and whether its libc10_cuda.so has a symbol table (.symtab,
#      which the tracker's slot check reads) and its GNU build-id (what a copy without one
#      is checked by);
#   2. runs a small training loop under `vramshim run --trace T --stacks 8` (PyTorch's default
#      caching allocator: the one with a trace tracker);
#   3. `vramshim summary T` and `summary --json T`: VERIFIED / FAILED that the hook attached
#      (its refusal line absent), that the trace holds tensor-level events (PyTorch's peak of
#      allocated tensors, with tensors in it) and that they name lines of the training
#      script (file:line, each line one of the script's own).
# Exits 1 if anything failed, 0 otherwise (also without a GPU or PyTorch: then SKIPPED).
# About 30 s on a GPU machine with PyTorch's libraries in the page cache.
#
# Usage: scripts/gpu-torch-events.sh [--out DIR] [--sim]
#   --sim  on the simulated GPU instead (`vramshim run --sim`; kernels are not computed,
#          so the loss is meaningless), to test this script without a GPU.
# Uses $VRAMSHIM if set, else target/release/vramshim; $PYTHON if set, else python3.
set -uo pipefail
# shellcheck source=scripts/gpu-common.sh
source "$(dirname "$0")/gpu-common.sh"

repo="$gpu_repo"
gpu_sim_allowed=1
gpu_options 2,18 "$@"
gpu_out_dir vramshim-gpu-torch-events
py="${PYTHON:-python3}"
vs="${VRAMSHIM:-$repo/target/release/vramshim}"

if [ ${#sim[@]} = 0 ]; then
  gpu_require "no NVIDIA GPU here (nvidia-smi -L failed); --sim runs this on the simulated GPU"
fi
if [ ! -x "$vs" ] || [ ! -f "$(dirname "$vs")/libvramshim.so" ]; then
  failed "no vramshim command with libvramshim.so beside it at $vs (set VRAMSHIM)"
  finish
fi

# --- 1. PyTorch and its libc10_cuda.so ----------------------------------------------------------
if ! "$py" -c 'import torch' >/dev/null 2>&1; then
  skipped "PyTorch is not installed for $py"
  finish
fi
"$py" - >"$out/torch-info.txt" 2>"$out/torch-info.err" <<'PY'
import os, torch
print("version", torch.__version__)
print("cuda", torch.version.cuda)
print("git", getattr(torch.version, "git_version", "?"))
print("lib", os.path.join(os.path.dirname(torch.__file__), "lib", "libc10_cuda.so"))
PY
version=$(sed -n 's/^version //p' "$out/torch-info.txt")
c10=$(sed -n 's/^lib //p' "$out/torch-info.txt")
echo "PyTorch: ${version:-?} (CUDA $(sed -n 's/^cuda //p' "$out/torch-info.txt"), git $(sed -n 's/^git //p' "$out/torch-info.txt"))"
echo "python: $("$py" -c 'import sys; print(sys.version.split()[0])') ($(command -v "$py"))"
if [ -f "$c10" ]; then
  if command -v readelf >/dev/null 2>&1; then
    if readelf -S -W "$c10" | grep -q ' \.symtab '; then symtab=yes; else symtab=no; fi
    build_id=$(readelf -n "$c10" | sed -n 's/.*Build ID: *\([0-9a-f]*\).*/\1/p' | head -1)
  else
    # Without binutils: the ELF section names and the GNU build-id note, read in Python.
    read -r symtab build_id < <("$py" - "$c10" <<'PY'
import struct, sys
d = open(sys.argv[1], "rb").read()
shoff, = struct.unpack_from("<Q", d, 0x28)
shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 0x3A)
secs = [struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * shentsize) for i in range(shnum)]
names = secs[shstrndx]
def name(s):
    o = names[4] + s[0]
    return d[o:d.index(b"\0", o)].decode()
symtab = "yes" if any(name(s) == ".symtab" for s in secs) else "no"
bid = "?"
for s in secs:
    if s[1] == 7:  # SHT_NOTE
        o, end = s[4], s[4] + s[5]
        while o + 12 <= end:
            nsz, dsz, typ = struct.unpack_from("<III", d, o)
            n = d[o + 12:o + 12 + nsz]
            desc = o + 12 + (nsz + 3) // 4 * 4
            if typ == 3 and n.rstrip(b"\0") == b"GNU":
                bid = d[desc:desc + dsz].hex()
            o = desc + (dsz + 3) // 4 * 4
print(symtab, bid)
PY
)
  fi
  echo "libc10_cuda.so: $c10"
  echo "  .symtab: $symtab; GNU build-id: ${build_id:-?}"
else
  echo "libc10_cuda.so: not found at $c10 (a PyTorch without CUDA?)"
fi

# --- 2. a training loop, traced -------------------------------------------------------------------
# Each line that allocates tensors is one of its own; main's lines are checked below.
cat >"$out/train.py" <<'PY'
import torch


def make_model(dev):
    layers = [torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)]
    return torch.nn.Sequential(*layers).to(dev)


def batch(step, dev):
    n = 64 + step % 7 * 16
    return torch.randn(n, 1024, device=dev), torch.randint(0, 1024, (n,), device=dev)


def main():
    torch.manual_seed(0)
    dev = "cuda"
    model = make_model(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    keep = []
    for step in range(30):
        x, y = batch(step, dev)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0:
            keep.append(torch.empty(8 << 20, dtype=torch.uint8, device=dev))
    torch.cuda.synchronize()
    print(f"loss={loss.item():.4f} allocated={torch.cuda.memory_allocated()} "
          f"max_allocated={torch.cuda.max_memory_allocated()}")


main()
PY
t="$out/torch-events.vramtrace"
rm -f "$t"
start=$(date +%s)
VRAMSHIM_LOG=info timeout 80 "$vs" run "${sim[@]}" --trace "$t" --stacks 8 -- "$py" "$out/train.py" \
  >"$out/train.log" 2>&1
rc=$?
echo "training loop: exit $rc in $(( $(date +%s) - start )) s: $(grep -E '^loss=' "$out/train.log" | tail -1)"
grep -E 'tensor-level events|allocator slot|vramshim: .*(refus|off)' "$out/train.log" | sed 's/^/  /' | head -5
if [ "$rc" != 0 ] || [ ! -s "$t" ]; then
  failed "the training loop under vramshim run --trace exited $rc (see $out/train.log)"
  finish
fi
if grep -q 'tensor-level events off' "$out/train.log"; then
  failed "the hook was refused: $(grep -m1 'tensor-level events off' "$out/train.log")"
else
  verified "the hook attached to PyTorch ${version}'s allocator (no refusal line)"
fi

# --- 3. what the trace says ----------------------------------------------------------------------
"$vs" summary "$t" >"$out/summary.txt" 2>&1 || failed "vramshim summary exited non-zero (see $out/summary.txt)"
"$vs" summary --json "$t" >"$out/summary.json" 2>"$out/summary-json.err" \
  || failed "vramshim summary --json exited non-zero (see $out/summary-json.err)"
sed -n "/PyTorch's peak of allocated tensors/,/largest segments/p" "$out/summary.txt" | head -16
"$py" - "$out/summary.json" "$out/train.py" >"$out/check.txt" 2>&1 <<'PY'
import json, re, sys
j = json.load(open(sys.argv[1]))
script = open(sys.argv[2]).read().splitlines()
tensors, sites, own = 0, [], []
for tr in j.get("traces", []):
    for d in tr.get("devices", []):
        p = d.get("torch_peak") or {}
        tensors += p.get("tensors", 0)
        for h in p.get("holders", []):
            sites.append(h["site"])
            m = re.search(r"\(train\.py:(\d+)\)$", h["site"])
            # The line must be one of the script's, and one that runs torch.
            if m and 0 < int(m.group(1)) <= len(script) and "(" in script[int(m.group(1)) - 1]:
                own.append(h["site"])
print("tensors", tensors)
print("sites", len(sites))
for s in sites[:8]:
    print("site", s)
print("own", len(own))
PY
cat "$out/check.txt" | sed 's/^/  /'
n=$(sed -n 's/^tensors //p' "$out/check.txt")
own=$(sed -n 's/^own //p' "$out/check.txt")
if [ "${n:-0}" -gt 0 ] 2>/dev/null; then
  verified "tensor-level events in the trace: PyTorch's peak of allocated tensors holds $n tensors"
else
  failed "no tensor-level events: the summary has no PyTorch peak with tensors (see $out/summary.txt, $out/train.log)"
fi
if [ "${own:-0}" -gt 0 ] 2>/dev/null; then
  verified "tensors named by lines of the training script: $(grep -m1 '^site .*train\.py' "$out/check.txt" | sed 's/^site //')"
else
  failed "no tensor named by a line of train.py (see $out/check.txt, $out/summary.txt)"
fi
finish
