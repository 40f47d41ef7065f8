#!/usr/bin/env bash
# The library's own synchronizations beside a stream capture on a real GPU: builds
# tests/workloads/pool/capture_sync.c against the real runtime and runs it (pool and cap-settle
# routes; a relaxed, thread-local and global capture held while a worker makes the library want
# a cuCtxSynchronize) without the library, with it, and with its old rule
# (VRAMSHIM_POOL_DEBUG=sync-by-mode). Each run prints one line (capture_sync: during= after=
# end= graph= syncs=): with the library every end must be 0 with a graph (graph=1); with
# sync-by-mode the driver is expected to invalidate the capture (end=901, graph=0).
# Usage: scripts/gpu-capture-sync.sh [OUTDIR]   ($VRAMSHIM_LIB: the library, default
# target/release/libvramshim.so). Exits 1 when a run with the library ends otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${1:-$(mktemp -d -t capture-sync.XXXXXX)}"
mkdir -p "$out"
lib="$(realpath "${VRAMSHIM_LIB:-target/release/libvramshim.so}")"
nvidia-smi -L | head -1 || { echo "no GPU"; exit 0; }
rt=""
for c in /usr/local/cuda/lib64/libcudart.so.12 /usr/local/cuda/lib64/libcudart.so.13 \
         /usr/lib/x86_64-linux-gnu/libcudart.so.12 /usr/lib/x86_64-linux-gnu/libcudart.so.13; do
  [ -e "$c" ] && rt="$c" && break
done
[ -n "$rt" ] || rt=$(find / -xdev \( -name 'libcudart.so.12' -o -name 'libcudart.so.13' \) 2>/dev/null | head -1)
[ -n "$rt" ] || { echo "no libcudart.so.12 or .13"; exit 2; }
echo "runtime: $rt"
gcc -O1 -std=gnu11 -Itests/workloads/include -o "$out/capture_sync" tests/workloads/pool/capture_sync.c \
  "$rt" -ldl -lpthread -Wl,-rpath,"$(dirname "$rt")" || exit 2
bad=0
for c in "relaxed global" "local global" "global relaxed"; do
  for route in pool settle; do
    if [ "$route" = pool ]; then set -- VRAMSHIM_POOL=stitch; else set -- VRAMSHIM_CAP=48MiB VRAMSHIM_CAP_CONTEXT=exclude; fi
    # shellcheck disable=SC2086
    echo "$route $c plain:        $(timeout 60 "$out/capture_sync" $route $c 2>&1 | tail -1)"
    # shellcheck disable=SC2086
    line=$(env "$@" LD_PRELOAD="$lib" timeout 60 "$out/capture_sync" $route $c 2>&1 | tail -1)
    echo "$route $c library:      $line"
    case "$line" in *" end=0 graph=1 "*) ;; *) bad=1 ;; esac
    # shellcheck disable=SC2086
    echo "$route $c sync-by-mode: $(env "$@" VRAMSHIM_POOL_DEBUG=sync-by-mode LD_PRELOAD="$lib" timeout 60 "$out/capture_sync" $route $c 2>&1 | tail -1)"
  done
done
exit $bad
