# shellcheck shell=bash
# Sourced by scripts/gpu-*.sh, not run: their shared start (the repository's root, the output
# directory, the arguments, whether there is a GPU) and the VERIFIED / FAILED / SKIPPED lines
# of the checks. Each gpu-*.sh stays runnable alone from a clone, on a bare GPU machine: this
# file sits beside it.

# The repository's root (the scripts run from it, or from anywhere) and the calling script's
# name as its messages give it (gpu-smoke.sh).
# shellcheck disable=SC2034 # read by the scripts that source this file
gpu_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
gpu_script="${0##*/}"

# Whether a GPU answers here: nvidia-smi is there and lists one.
gpu_present() {
  command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1
}

# The first GPU nvidia-smi lists ("GPU 0: NVIDIA H200 (UUID: ...)").
gpu_name() {
  nvidia-smi -L | head -1
}

# gpu_options HELP_LINES "$@": the options of a script whose checks print VERIFIED / FAILED /
# SKIPPED: --out DIR (sets out), --sim where gpu_sim_allowed=1 (sets sim to (--sim)), -h/--help
# (prints lines HELP_LINES of the script, "2,18", its header without the '# '); anything else,
# and --out without its directory, is refused with one line and exit 2.
out=""
# shellcheck disable=SC2034 # read by gpu-torch-events.sh
sim=()
gpu_options() {
  local help=$1
  shift
  while [ $# -gt 0 ]; do
    case "$1" in
      --out) [ $# -ge 2 ] || gpu_bad_argument "--out needs a directory"; out="$2"; shift 2 ;;
      --sim) [ "${gpu_sim_allowed:-0}" = 1 ] || gpu_bad_argument "unknown argument $1"; sim=(--sim); shift ;;
      -h|--help) sed -n "${help}p" "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
      *) gpu_bad_argument "unknown argument $1" ;;
    esac
  done
}

gpu_bad_argument() {
  echo "$gpu_script: $1" >&2
  exit 2
}

# gpu_out_dir NAME: out (made if missing), a new temporary directory named after NAME unless
# --out gave one.
gpu_out_dir() {
  [ -n "$out" ] || out="$(mktemp -d -t "$1.XXXXXX")"
  mkdir -p "$out"
}

# The checks' lines and counts; finish prints the counts and exits 1 if anything failed.
pass=0; fail=0; skip=0
verified() { echo "VERIFIED: $*"; pass=$((pass+1)); }
failed()   { echo "FAILED:   $*"; fail=$((fail+1)); }
skipped()  { echo "SKIPPED:  $*"; skip=$((skip+1)); }
finish() {
  echo
  echo "${gpu_script%.sh}: $pass verified, $fail failed, $skip skipped (logs in $out)"
  [ "$fail" = 0 ]
  exit $?
}

# gpu_require WHY: without a GPU, SKIPPED: WHY and finish; with one, says which.
gpu_require() {
  if ! gpu_present; then
    skipped "$1"
    finish
  fi
  echo "GPU: $(gpu_name)"
}
