# shellcheck shell=bash
# Sourced by scripts/setup-* and .ci/run, not run: what they share to make sure that what
# they installed still works before they trust it.
#
# A setup script's marker says that an installation finished; it does not say that its files
# are still there. The caches live outside the clone, outlive every run and are shared by every
# checkout of the user, and a file can go missing from them; the tests CI requires would then
# run and fail instead of being reinstalled. So a cached installation is used only when
#   - every file pip recorded for it (each *.dist-info/RECORD) is there at its recorded size,
#     and each pinned package has its record (setup_pip_records): this catches a library the
#     tests load late, that the import below never opens;
#   - the script's own check passes: what the tests do first with it (import the module, open
#     the library, run the interpreter).
# A check can fail for a passing reason (an import killed under memory pressure): a cached
# installation is judged damaged only when its check fails twice in a row. One that is damaged
# is installed again from scratch, into a new directory beside it, under the script's lock
# (`flock` on DIR.lock, which every setup run of that cache takes before it installs), and that
# one must pass the same checks, or the script stops with one line saying why; then the new
# tree takes the old one's place by rename (setup_swap_in), and the old one is removed after:
# the cache is shared by every checkout of the user, and a test reading it meanwhile sees the
# old tree or the new one, never one half deleted (setup-cpython314 checks its new tree once
# it is in place, since its paths are patched for that place, and removes it if the check
# fails).

setup_name=${0##*/}

# setup_pip_records DIR [PIN...]: every file that pip recorded in DIR (a `--target` tree or a
# site-packages directory) is there at its recorded size, and each PIN (NAME==VERSION, or NAME
# alone) has its dist-info in DIR. Two kinds of entry are left out: paths leaving DIR (console
# scripts, recorded relative to a directory `--target` does not keep) and byte code (Python
# writes it again). On failure prints one line naming what is wrong and returns 1.
setup_pip_records() {
    python3 - "$@" <<'PY'
import csv, glob, os, re, sys

root, pins = sys.argv[1], sys.argv[2:]
norm = lambda name: re.sub(r"[-_.]+", "_", name).lower()
infos = {}
for d in glob.glob(os.path.join(glob.escape(root), "*.dist-info")):
    name, _, version = os.path.basename(d)[: -len(".dist-info")].partition("-")
    infos.setdefault(norm(name), []).append(version)
if not infos:
    sys.exit(f"no package records (*.dist-info) in {root}")
for pin in pins:
    name, _, version = pin.partition("==")
    name = re.split(r"[<>=!~\[ ]", name, maxsplit=1)[0]
    found = infos.get(norm(name))
    if not found:
        sys.exit(f"{name} has no record in {root}")
    if version and version not in found:
        sys.exit(f"{name} {version} is pinned but {root} records {', '.join(found)}")
bad, files = [], 0
for rec in sorted(glob.glob(os.path.join(glob.escape(root), "*.dist-info", "RECORD"))):
    with open(rec, newline="") as f:
        for row in csv.reader(f):
            if len(row) < 3 or not row[2] or row[0].startswith("../"):
                continue
            if "__pycache__" in row[0].split("/"):
                continue
            files += 1
            try:
                size = os.stat(os.path.join(root, row[0])).st_size
            except OSError:
                bad.append(f"{row[0]} is missing")
                continue
            if size != int(row[2]):
                bad.append(f"{row[0]} has {size} bytes, {row[2]} when installed")
if bad:
    more = f" (and {len(bad) - 1} more of its {files} files)" if len(bad) > 1 else ""
    sys.exit(f"{os.path.join(root, '')}{bad[0]}{more}")
PY
}

# setup_run_check FUNC ARG...: runs FUNC ARG... (a script's check), its output hidden and no
# byte code written into the installation; on failure prints the check's last line of output
# (a Python error's own line) and returns 1.
setup_run_check() {
    local out
    if out=$(PYTHONDONTWRITEBYTECODE=1 "$@" 2>&1); then
        return 0
    fi
    out=$(printf '%s\n' "$out" | sed '/^[[:space:]]*$/d' | tail -n1)
    echo "${out:-$1 failed without a message}"
    return 1
}

# setup_cached_works DIR FUNC ARG...: the finished installation in DIR passes FUNC ARG... (at
# the first try or the second); otherwise says once (on stderr) that it is damaged and why, and returns 1 (the caller then
# installs it again, or with --check reports it missing).
setup_damaged=""
setup_cached_works() {
    local dir=$1 why
    shift
    why=$(setup_run_check "$@") && return 0
    # once more before it is judged damaged (see the top)
    why=$(setup_run_check "$@") && return 0
    if [[ -z $setup_damaged ]]; then
        echo "$setup_name: the installation in $dir is damaged: $why" >&2
    fi
    setup_damaged=$why
    return 1
}

# setup_new_works WHAT FUNC ARG...: a new installation passes FUNC ARG...; otherwise says so in
# one line and returns 1 (the caller stops: an installation is tried once a run).
setup_new_works() {
    local what=$1 why
    shift
    why=$(setup_run_check "$@") && return 0
    if [[ -n $setup_damaged ]]; then
        echo "$setup_name: $what, installed again after the damage, does not work either: $why" >&2
    else
        echo "$setup_name: $what does not work after install: $why" >&2
    fi
    return 1
}

# setup_apt_tool COMMAND PACKAGE: COMMAND --version runs (within two minutes: a tool that
# hangs is as broken as one that fails), else Debian's PACKAGE is installed (again, if it was: a
# damaged one is reinstalled), after an apt-get update when the first try fails; if COMMAND
# --version still fails, stops with one line.
setup_apt_tool() {
    local cmd=$1 pkg=$2 why sudo=()
    why=$(setup_run_check timeout 120 "$cmd" --version) && return 0
    [[ $(id -u) == 0 ]] || sudo=(sudo)
    if command -v "$cmd" >/dev/null; then
        echo "$setup_name: $cmd --version fails ($why): reinstalling $pkg" >&2
    fi
    "${sudo[@]}" apt-get install -y --reinstall --no-install-recommends "$pkg" ||
        { "${sudo[@]}" apt-get update && "${sudo[@]}" apt-get install -y --reinstall --no-install-recommends "$pkg"; } ||
        { echo "$setup_name: apt-get could not install $pkg" >&2; exit 1; }
    why=$(setup_run_check timeout 120 "$cmd" --version) ||
        { echo "$setup_name: $cmd --version fails after installing $pkg: $why" >&2; exit 1; }
}

# setup_swap_in NEW DIR: NEW (a finished, checked tree beside DIR, on the same file system)
# takes DIR's place, and the tree DIR held is removed after. Called under the script's lock. A
# reader of DIR sees the old tree whole or the new one whole: the two are exchanged in one
# rename (renameat2 RENAME_EXCHANGE) where the file system can; elsewhere the old tree is
# renamed aside first, and DIR is missing between the two renames, never partly deleted.
setup_swap_in() {
    local new=$1 dir=$2
    if [[ ! -e $dir ]]; then
        mv -T "$new" "$dir"
        return
    fi
    if python3 - "$new" "$dir" <<'PY'
import ctypes, os, sys

libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
new, old = (os.fsencode(p) for p in sys.argv[1:3])
sys.exit(libc.renameat2(AT_FDCWD, new, AT_FDCWD, old, RENAME_EXCHANGE) != 0)
PY
    then
        rm -rf "$new" # the old tree, now at NEW's name
    else
        local aside=$dir.old.$$
        rm -rf "$aside"
        mv -T "$dir" "$aside"
        mv -T "$new" "$dir"
        rm -rf "$aside"
    fi
}
