#!/usr/bin/env bash
# The checks that need a real NVIDIA GPU (the test suite runs on the simulated one):
#   1. vramshim demo on the real GPU (plain / capped / pooled / what-if);
#   2. a real PyTorch training loop under vramshim with a trace, a cap and the pool, and an
#      out-of-memory under a small cap that PyTorch reports as torch.OutOfMemoryError;
#   3. JAX and CuPy under a cap, when installed; NVML (pynvml) reporting the cap, when installed;
#   4. the driver's answers to the questions the pool and the capture handling rest on
#      (tests/workloads/sim/driver_facts.c), compared one by one with the simulator's
#      (tests/workloads/sim/driver_facts.expected): a difference means cuda-sim is unfaithful;
#   5. a PyTorch CUDA graph captured and replayed under --pool stitch (PyTorch's default route
#      there is backend:cudaMallocAsync, so the capture's allocations run through the pool);
#   6. the library's own synchronizations beside real captures (scripts/gpu-capture-sync.sh);
#   7. PyTorch's tensor-level events (scripts/gpu-torch-events.sh).
# Prints VERIFIED / SKIPPED / FAILED per check; exits 1 if anything failed, 0 otherwise
# (also when there is no GPU: then everything is SKIPPED).
#
# Usage: scripts/gpu-smoke.sh [--out DIR]      (default: a temporary directory, kept)
# Uses $VRAMSHIM if set, else target/release/vramshim (building it when missing).
set -uo pipefail
# shellcheck source=scripts/gpu-common.sh
source "$(dirname "$0")/gpu-common.sh"

repo="$gpu_repo"
gpu_options 2,18 "$@"
gpu_out_dir vramshim-gpu-smoke
py="${PYTHON:-python3}"

# --- is there a GPU? -------------------------------------------------------------------------
gpu_require "no NVIDIA GPU here (nvidia-smi -L failed): nothing to verify on hardware; scripts/test covers the simulated GPU"
total_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 | head -1 | tr -d ' ')

# --- the vramshim command --------------------------------------------------------------------
vs="${VRAMSHIM:-$repo/target/release/vramshim}"
if [ ! -x "$vs" ] || [ ! -f "$(dirname "$vs")/libvramshim.so" ]; then
  echo "building (cargo build --release --workspace) ..."
  (cd "$repo" && cargo build --release --workspace) >"$out/build.log" 2>&1 \
    || { failed "build (see $out/build.log)"; finish; }
  vs="$repo/target/release/vramshim"
fi

# --- 1. the demo on the real GPU -------------------------------------------------------------
if "$vs" demo -o "$out/vramshim-demo.html" --work-dir "$out/demo" >"$out/demo.log" 2>&1; then
  if grep -q "real GPU" "$out/demo.log" \
     && grep -E '^\(b\)' "$out/demo.log" | grep -q refused \
     && grep -E '^\(c\)' "$out/demo.log" | grep -q completed; then
    verified "vramshim demo ran on the real GPU: (b) refused under the cap, (c) pooled completed ($out/vramshim-demo.html)"
  else
    failed "vramshim demo on the real GPU did not show (b) refused and (c) completed (see $out/demo.log)"
  fi
else
  failed "vramshim demo exited non-zero (see $out/demo.log)"
fi

# --- 2. PyTorch ------------------------------------------------------------------------------
if "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  cat >"$out/train.py" <<'PY'
import sys, torch
torch.manual_seed(0)
dev = "cuda"
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).to(dev)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(50):
    x = torch.randn(64 + step % 7 * 16, 1024, device=dev)
    loss = model(x).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
print(f"loss={loss.item():.4f} total={total} free={free}")
if len(sys.argv) > 1 and sys.argv[1] == "oom":
    try:
        big = torch.empty(int(sys.argv[2]), dtype=torch.uint8, device=dev)
        print("NO-OOM")
    except torch.OutOfMemoryError as e:
        print("OOM-RAISED")
PY
  cap=$((total_mib / 4))MiB
  if "$vs" run --cap "$cap" --pool stitch --trace "$out/torch-%p.vramtrace" --stacks 8 -- "$py" "$out/train.py" \
       >"$out/torch.log" 2>&1; then
    t=$(ls "$out"/torch-*.vramtrace 2>/dev/null | head -1)
    want=$((total_mib / 4 * 1048576))
    got=$(sed -n 's/.*total=\([0-9]*\).*/\1/p' "$out/torch.log" | tail -1)
    if [ -n "$t" ] && "$vs" summary "$t" >"$out/torch-summary.txt" 2>&1; then
      verified "PyTorch training loop under --cap $cap --pool stitch --trace: completed, trace summarized ($out/torch-summary.txt)"
    else
      failed "PyTorch: no readable trace (see $out/torch.log)"
    fi
    if [ "$got" = "$want" ]; then
      verified "PyTorch sees the cap: torch.cuda.mem_get_info() total = $got bytes"
    else
      failed "PyTorch mem_get_info total = ${got:-?}, expected the cap $want (see $out/torch.log)"
    fi
  else
    failed "PyTorch training loop under vramshim exited non-zero (see $out/torch.log)"
  fi
  # An allocation beyond a small cap: PyTorch must see a normal out-of-memory.
  if "$vs" run --cap 1GiB -- "$py" "$out/train.py" oom $((2 * 1024 * 1024 * 1024)) >"$out/torch-oom.log" 2>&1 \
     && grep -q OOM-RAISED "$out/torch-oom.log"; then
    verified "PyTorch under --cap 1GiB: a 2 GiB tensor raises torch.OutOfMemoryError (refused like a real OOM)"
  else
    failed "PyTorch under --cap 1GiB did not raise torch.OutOfMemoryError (see $out/torch-oom.log)"
  fi
else
  skipped "PyTorch with CUDA is not installed ($py -c 'import torch' / torch.cuda.is_available())"
fi

# --- 3. JAX, CuPy, NVML ----------------------------------------------------------------------
if "$py" -c 'import jax; assert jax.devices("gpu")' >/dev/null 2>&1; then
  cat >"$out/jax_check.py" <<'PY'
import jax, jax.numpy as jnp
x = jnp.ones((4096, 4096)); y = (x @ x).block_until_ready()
stats = jax.devices()[0].memory_stats() or {}
print("bytes_limit", stats.get("bytes_limit"))
PY
  if XLA_PYTHON_CLIENT_PREALLOCATE=false "$vs" run --cap 2GiB --trace "$out/jax-%p.vramtrace" -- "$py" "$out/jax_check.py" \
       >"$out/jax.log" 2>&1 && ls "$out"/jax-*.vramtrace >/dev/null 2>&1; then
    verified "JAX ran under --cap 2GiB with a trace ($(grep bytes_limit "$out/jax.log" | tail -1))"
  else
    failed "JAX under vramshim (see $out/jax.log)"
  fi
else
  skipped "JAX with a GPU backend is not installed"
fi

if "$py" -c 'import cupy; cupy.cuda.runtime.getDeviceCount()' >/dev/null 2>&1; then
  cat >"$out/cupy_check.py" <<'PY'
import cupy
cupy.cuda.set_allocator(None)          # every array is a cudaMalloc: vramshim sees each one
a = cupy.ones((1024, 1024), dtype=cupy.float32); b = (a * 2).sum(); cupy.cuda.Device().synchronize()
# Without CuPy's pool an allocation is a bare cudaMalloc, and CuPy reports a refusal as the
# runtime's error (CUDARuntimeError, status 2 = cudaErrorMemoryAllocation), as for a real out-of-memory.
try:
    big = cupy.empty(2 * 1024**3, dtype=cupy.uint8)
    print("NO-OOM")
except cupy.cuda.memory.OutOfMemoryError:
    print("OOM-RAISED")
except cupy.cuda.runtime.CUDARuntimeError as e:
    print("OOM-RAISED" if e.status == 2 else f"OTHER {e}")
PY
  if "$vs" run --cap 1GiB --pool stitch -- "$py" "$out/cupy_check.py" >"$out/cupy.log" 2>&1 \
     && grep -q OOM-RAISED "$out/cupy.log"; then
    verified "CuPy (static cudart) under --cap 1GiB --pool stitch: arrays work, a 2 GiB array is refused with cudaErrorMemoryAllocation"
  else
    failed "CuPy under vramshim (see $out/cupy.log)"
  fi
else
  skipped "CuPy is not installed"
fi

if "$py" -c 'import pynvml' >/dev/null 2>&1; then
  if "$vs" run --cap 1GiB -- "$py" -c '
import pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0)
print("total", pynvml.nvmlDeviceGetMemoryInfo(h).total)' >"$out/nvml.log" 2>&1 \
     && grep -q "total 1073741824" "$out/nvml.log"; then
    verified "NVML (pynvml) inside the process reports total = the 1 GiB cap"
  else
    failed "NVML does not report the cap (see $out/nvml.log)"
  fi
else
  skipped "pynvml is not installed (NVML check)"
fi

# --- 4. the driver's answers, against the simulator's -----------------------------------------
facts_src="$repo/tests/workloads/sim/driver_facts.c"
facts_want="$repo/tests/workloads/sim/driver_facts.expected"
cc_bin="${CC:-cc}"
if ! command -v "$cc_bin" >/dev/null 2>&1; then
  skipped "driver facts: no C compiler ($cc_bin) to build tests/workloads/sim/driver_facts.c"
elif ! "$cc_bin" -O1 -I"$repo/tests/workloads/include" -o "$out/driver_facts" "$facts_src" -ldl \
       >"$out/driver_facts.build.log" 2>&1; then
  failed "driver facts: tests/workloads/sim/driver_facts.c did not build (see $out/driver_facts.build.log)"
elif ! "$out/driver_facts" >"$out/driver_facts.log" 2>&1; then
  failed "driver facts: the probe exited non-zero on this driver (see $out/driver_facts.log)"
else
  while IFS='=' read -r name want; do
    got=$(sed -n "s/^fact $name=//p" "$out/driver_facts.log" | head -1)
    if [ "$got" = "$want" ]; then
      verified "driver fact $name=$got, as cuda-sim answers"
    else
      failed "driver fact $name: this driver answers ${got:-nothing}, cuda-sim $want (tests/workloads/sim/driver_facts.expected; make cuda-sim faithful)"
    fi
  done < <(sed -n 's/^fact //p' "$facts_want")
fi

# --- 5. a PyTorch CUDA graph through the pool ------------------------------------------------
if "$py" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  cat >"$out/graph.py" <<'PY'
import torch
torch.manual_seed(0)
dev = "cuda"
print("backend", torch.cuda.get_allocator_backend())
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)).to(dev)
static_x = torch.randn(32, 256, device=dev)
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    for _ in range(3):
        model(static_x)
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    static_y = model(static_x)
ok = True
for _ in range(5):
    static_x.copy_(torch.randn(32, 256, device=dev))
    graph.replay()
    scratch = [torch.empty(1 << 20, device=dev) for _ in range(4)]   # eager work beside the graph
    ok = ok and torch.allclose(static_y, model(static_x), atol=1e-5)
    del scratch
del graph
torch.cuda.synchronize()
print("GRAPH-OK" if ok else "GRAPH-MISMATCH")
PY
  if "$vs" run --pool stitch --trace "$out/graph-%p.vramtrace" -- "$py" "$out/graph.py" >"$out/graph.log" 2>&1 \
     && grep -q GRAPH-OK "$out/graph.log"; then
    verified "PyTorch CUDA graph captured and replayed 5 times under --pool stitch ($(grep ^backend "$out/graph.log")): results equal to eager"
  else
    failed "PyTorch CUDA graph under --pool stitch (see $out/graph.log)"
  fi
else
  skipped "PyTorch with CUDA is not installed (CUDA graph check)"
fi

# --- 6. the library's synchronizations beside real captures ----------------------------------
if VRAMSHIM_LIB="$(dirname "$vs")/libvramshim.so" bash "$repo/scripts/gpu-capture-sync.sh" "$out/capture-sync" \
     >"$out/capture-sync.log" 2>&1; then
  verified "relaxed, thread-local and global captures beside the pool's and the cap's synchronizations end with a graph (scripts/gpu-capture-sync.sh)"
else
  failed "a capture beside the library's synchronizations did not end with a graph (see $out/capture-sync.log)"
fi

# --- 7. PyTorch's tensor-level events --------------------------------------------------------
if VRAMSHIM="$vs" bash "$repo/scripts/gpu-torch-events.sh" --out "$out/torch-events" >"$out/torch-events.log" 2>&1; then
  if grep -q "^VERIFIED: tensors named" "$out/torch-events.log"; then
    verified "PyTorch tensor-level events named by the training script's lines (scripts/gpu-torch-events.sh)"
  else
    skipped "PyTorch tensor-level events (see $out/torch-events.log)"
  fi
else
  failed "PyTorch tensor-level events (see $out/torch-events.log)"
fi

finish
