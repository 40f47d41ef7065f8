#!/usr/bin/env bash
# Builds vramshim in release mode and installs it under a prefix (default ~/.local):
#   <prefix>/bin/vramshim                     the command
#   <prefix>/lib/vramshim/libvramshim.so      the LD_PRELOAD library
#   <prefix>/lib/vramshim/cuda-sim/*          the simulated GPU (for `vramshim run --sim` and `demo`)
# `vramshim run` finds the library and the simulated GPU relative to its own executable, so
# nothing else needs configuring. Installing over an earlier install is safe even while jobs
# run: every file is written next to its destination and renamed into place, so a running
# process keeps the (old) file it has mapped.
#
# Usage: scripts/install.sh [--prefix DIR] [--no-build]
# Honours CARGO_TARGET_DIR (reuses an existing build).
set -euo pipefail

prefix="${HOME}/.local"
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) [ $# -ge 2 ] || { echo "install.sh: --prefix needs a directory" >&2; exit 2; }
              prefix="$2"; shift 2 ;;
    --prefix=*) prefix="${1#--prefix=}"; shift ;;
    --no-build) build=0; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "install.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
target="${CARGO_TARGET_DIR:-$repo/target}"
case "$target" in /*) ;; *) target="$repo/$target" ;; esac
out="$target/release"

if [ "$build" = 1 ]; then
  echo "install.sh: building (cargo build --release --workspace)" >&2
  cargo build --release --workspace
fi
# The simulated GPU's libraries under their real names in $out/cuda-sim (what
# scripts/sim-layout does; done here too so this script does not depend on it).
if [ -f "$out/libvramsim_driver.so" ]; then
  mkdir -p "$out/cuda-sim"
  for pair in libcuda.so.1=libvramsim_driver.so libcudart.so.12=libvramsim_runtime12.so \
              libcudart.so.13=libvramsim_runtime13.so libcudart_static.a=libvramsim_runtime_static.a \
              libnvidia-ml.so.1=libvramsim_nvml.so; do
    name="${pair%%=*}"; src="$out/${pair#*=}"
    if [ -f "$src" ]; then
      cp "$src" "$out/cuda-sim/.$name.$$" && mv -f "$out/cuda-sim/.$name.$$" "$out/cuda-sim/$name"
    fi
  done
  for pair in libcuda.so=libcuda.so.1 libcudart.so=libcudart.so.12 libnvidia-ml.so=libnvidia-ml.so.1; do
    ln -sfn "${pair#*=}" "$out/cuda-sim/.${pair%%=*}.$$" && mv -fT "$out/cuda-sim/.${pair%%=*}.$$" "$out/cuda-sim/${pair%%=*}"
  done
fi

for f in "$out/vramshim" "$out/libvramshim.so"; do
  [ -f "$f" ] || { echo "install.sh: $f is missing; the build did not produce it" >&2; exit 1; }
done

mkdir -p "$prefix/bin" "$prefix/lib/vramshim/cuda-sim"
prefix="$(cd "$prefix" && pwd)"

# put SRC DEST MODE: copy next to DEST, then rename over it (atomic on one file system).
put() {
  local tmp
  tmp="$(dirname "$2")/.$(basename "$2").tmp.$$"
  cp -L "$1" "$tmp"
  chmod "$3" "$tmp"
  mv -f "$tmp" "$2"
}
# link TARGET DEST: a relative symlink, replaced atomically.
link() {
  local tmp
  tmp="$(dirname "$2")/.$(basename "$2").tmp.$$"
  ln -sfn "$1" "$tmp"
  mv -fT "$tmp" "$2"
}

put "$out/vramshim" "$prefix/bin/vramshim" 755
put "$out/libvramshim.so" "$prefix/lib/vramshim/libvramshim.so" 755

sim="$out/cuda-sim"
if [ -d "$sim" ]; then
  for f in "$sim"/*; do
    [ -e "$f" ] || continue
    name="$(basename "$f")"
    dest="$prefix/lib/vramshim/cuda-sim/$name"
    t="$(readlink "$f" || true)"
    if [ -L "$f" ] && [ "${t#*/}" = "$t" ] && [ -e "$sim/$t" ]; then
      link "$t" "$dest"          # e.g. libcuda.so -> libcuda.so.1: keep one library, two names
    elif [ -f "$f" ]; then
      case "$name" in *.a) mode=644 ;; *) mode=755 ;; esac
      put "$f" "$dest" "$mode"
    fi
  done
  # driver/: the driver and NVML alone, what `vramshim run --sim` puts first on the library
  # path so that the program's own runtime runs.
  mkdir -p "$prefix/lib/vramshim/cuda-sim/driver"
  for pair in libcuda.so.1=../libcuda.so.1 libcuda.so=../libcuda.so.1 \
              libnvidia-ml.so.1=../libnvidia-ml.so.1 libnvidia-ml.so=../libnvidia-ml.so.1; do
    link "${pair#*=}" "$prefix/lib/vramshim/cuda-sim/driver/${pair%%=*}"
  done
  # Helper programs of the simulated GPU (e.g. vramsim-smi), when built.
  for b in vramsim-smi; do
    [ -f "$out/$b" ] && put "$out/$b" "$prefix/lib/vramshim/cuda-sim/$b" 755
  done
else
  echo "install.sh: warning: $sim does not exist; 'vramshim run --sim' and 'vramshim demo' without a GPU will not work" >&2
fi

echo "installed: $prefix/bin/vramshim"
echo "           $prefix/lib/vramshim/libvramshim.so"
[ -d "$sim" ] && echo "           $prefix/lib/vramshim/cuda-sim/"
case ":$PATH:" in
  *":$prefix/bin:"*) ;;
  *) echo "note: $prefix/bin is not on PATH; add it: export PATH=\"$prefix/bin:\$PATH\"" ;;
esac
