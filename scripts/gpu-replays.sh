#!/usr/bin/env bash
# Issue 17's traces replayed on a real NVIDIA GPU, side by side in one run:
#   raw:     `vramshim replay TRACE --live --pool all` (cudaMalloc/cudaFree, no pool and the stitch
#            pool), live figures next to the pool model's;
#   PyTorch: `vramshim replay TRACE --live --through pytorch` under PyTorch's default allocator,
#            under expandable_segments:True, and under `--pool stitch` (PyTorch's route there is
#            backend:cudaMallocAsync), with a pattern checked in every block (`--pattern sample`).
# Peak reserved is what vramshim's trace records of the process's device memory (PyTorch's
# segments, or the pool's pages). Prints every run's output, then one table.
# Usage: scripts/gpu-replays.sh [--out DIR]   (uses $VRAMSHIM, else target/release/vramshim)
set -uo pipefail
# shellcheck source=scripts/gpu-common.sh
source "$(dirname "$0")/gpu-common.sh"
repo="$gpu_repo"
gpu_options 2,10 "$@"
vs="${VRAMSHIM:-$repo/target/release/vramshim}"
T="$repo/tests/workloads/traces"
traces="$T/bert_serve.rmm.csv $T/vit_train.rmm.csv $T/t5_train.rmm.csv $T/gpu/gpt2_train.rmm.csv $T/gpu/mlp_train.rmm.csv $T/gpu/vit_train.rmm.csv"
if ! gpu_present; then
    echo "gpu-replays: no NVIDIA GPU here (nvidia-smi -L failed)"; exit 0
fi
gpu_out_dir vramshim-gpu-replays
echo "GPU: $(gpu_name); $(python3 -c 'import torch; print("torch", torch.__version__)' 2>/dev/null)"
mib() { sed -n "s/.*$1 *\([0-9.]*\) MiB.*/\1/p" | head -1; }
rows=()
for t in $traces; do
    n=$(basename "$(dirname "$t")")/$(basename "$t" .rmm.csv); n=${n#traces/}
    timeout 60 "$vs" replay "$t" --live --pool all >"$out/$(echo "$n" | tr / _).raw" 2>&1
    raw="$out/$(echo "$n" | tr / _).raw"; cat "$raw"
    sl=$(awk '/^stitch +live/ {print $4}' "$raw"); sm=$(awk '/^stitch/ {f=1} f && /model/ {print $3; exit}' "$raw")
    dl=$(awk '/^direct +live/ {print $4}' "$raw")
    tp=()
    for conf in "" "expandable_segments:True" stitch; do
        f="$out/$(echo "$n" | tr / _).torch.${conf:-default}"
        if [ "$conf" = stitch ]; then
            PYTORCH_CUDA_ALLOC_CONF= timeout 90 "$vs" replay "$t" --live --through pytorch --pool stitch --pattern sample >"$f" 2>&1
        else
            PYTORCH_CUDA_ALLOC_CONF=$conf timeout 90 "$vs" replay "$t" --live --through pytorch >"$f" 2>&1
        fi
        echo "== $n through PyTorch (${conf:-default})"; grep -v '^ *$' "$f"
        tp+=("$(mib 'peak reserved' <"$f")")
    done
    # the pattern written into every block of the stitch run, checked before its free
    bad=$(sed -n 's/.*"mismatches": \([0-9]*\).*/\1/p' "$f" | head -1)
    done_=$(sed -n 's/.*"completed": \(true\|false\).*/\1/p' "$f" | head -1)
    rows+=("| $n | ${dl:-?} | ${sl:-?} | ${sm:-?} | ${tp[0]:-?} | ${tp[1]:-?} | ${tp[2]:-?} | ${done_:-?} / ${bad:-?} |")
done
echo
echo "| trace | raw: no pool | raw: stitch live | raw: stitch model | PyTorch default | expandable segments | PyTorch + stitch | stitch run completed / pattern mismatches |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
printf '%s\n' "${rows[@]}"
echo "(peak reserved, MiB; logs in $out)"
