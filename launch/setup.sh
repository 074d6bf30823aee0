#!/usr/bin/env bash
# launch/setup.sh: make (or update) the course's virtual environment.
#
#   bash launch/setup.sh            # venv at .venv; quick no-op when nothing changed
#   bash launch/setup.sh --quiet    # print nothing when nothing changed (lab.sh, test.sh use this)
#
# What it does:
#   1. creates the venv at ${VENV:-<repo>/.venv} with ${PYTHON_FOR_VENV:-python3} (Python >= 3.10);
#   2. torch: keeps the venv's torch if it is already >= 2.13 (for example a CUDA build you
#      installed yourself); installs ${TORCH_SPEC:-torch==2.13.0} if there is none; stops with
#      a message if the venv's torch is older;
#   3. pip install -e '<repo>[test]': the course (library, quizzes, JupyterLab, ...) and its test
#      extra (pytest, pytest-xdist, playwright, nbval, ruff, pre-commit), always, so that lab.sh
#      and test.sh share one environment and `bash launch/test.sh` works on a fresh machine;
#   4. writes a stamp (a hash of pyproject.toml and this file) into the venv: while it matches,
#      later runs skip steps 2-3 and take well under a second.
#
# Why torch first: pyproject.toml says torch>=2.13; with no torch installed, pip would resolve
# that to the newest default build, which on Linux is a multi-GB CUDA build.
#
# GPU users: install the CUDA build of torch into the venv FIRST, with the command pytorch.org's
# install selector gives for your driver, then run this script; it keeps that torch:
#   python3 -m venv .venv
#   .venv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cuXYZ
#   bash launch/setup.sh
# (or in one go: TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cuXYZ"
#  bash launch/setup.sh; TORCH_SPEC is split into pip arguments.)
#
# Environment: VENV, PYTHON_FOR_VENV, TORCH_SPEC (above); SETUP_QUIET=1 is the same as --quiet;
# SETUP_FORCE=1 ignores the stamp.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SELF="$ROOT/launch/setup.sh"
VENV="${VENV:-$ROOT/.venv}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
QUIET="${SETUP_QUIET:-0}"
for arg in "$@"; do
    case "$arg" in
        -q|--quiet) QUIET=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "setup.sh: unknown argument '$arg' (try --help)" >&2; exit 2 ;;
    esac
done

say() { echo "setup: $*"; }
die() { echo "setup.sh: $*" >&2; exit 2; }
START=$SECONDS

# pip here prints many harmless "WARNING: Location 'file:///...' is ignored" lines.
pip_filter() { grep -v -E "^WARNING: Location '.*' is ignored" || true; }

# Run pip quietly into a log; on failure show the log's tail and stop.
PIP_LOG="$VENV/setup-pip.log"
run_pip() {
    if ! "$VPY" -m pip "$@" >"$PIP_LOG" 2>&1; then
        echo "setup.sh: pip $* failed; the end of its output (full log: $PIP_LOG):" >&2
        pip_filter <"$PIP_LOG" | tail -n 25 >&2
        exit 1
    fi
    local installed
    installed=$(grep '^Successfully installed' "$PIP_LOG" | sed 's/^Successfully installed //' || true)
    if [[ -n "$installed" ]]; then
        local count
        count=$(wc -w <<<"$installed")
        if (( count > 6 )); then
            say "  installed $count packages: $(cut -d' ' -f1-6 <<<"$installed") ..."
        else
            say "  installed: $installed"
        fi
    fi
}

# 1. The venv -------------------------------------------------------------------------------
VPY="$VENV/bin/python"
if [[ ! -x "$VPY" ]]; then
    BASE="${PYTHON_FOR_VENV:-python3}"
    command -v "$BASE" >/dev/null 2>&1 || die "no '$BASE' found; install Python >= 3.10 or set PYTHON_FOR_VENV=/path/to/python3"
    "$BASE" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null \
        || die "Python >= 3.10 is needed, '$BASE' is $("$BASE" -c 'import platform; print(platform.python_version())' 2>/dev/null || echo unknown); set PYTHON_FOR_VENV=/path/to/python3.11"
    say "creating venv $VENV with $("$BASE" -c 'import sys; print(sys.executable, sys.version.split()[0])')"
    "$BASE" -m venv "$VENV" || die "could not create the venv (Debian/Ubuntu: apt install python3-venv)"
fi
"$VPY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || die "the venv $VENV has Python $("$VPY" -c 'import platform; print(platform.python_version())'), >= 3.10 is needed; remove it or set VENV=another/path"

# 2. Anything changed since the last successful setup? ----------------------------------------
# The stamp covers: pyproject.toml, this script, the repo's location (the editable install
# points at it) and which packages exist (an editable install maps the packages found when it
# ran, so a package added later means a reinstall).
STAMP="$VENV/.fsdp-course-setup.stamp"
WANT=$("$VPY" - "$ROOT" "$SELF" <<'PY'
import hashlib, os, sys
root, this = sys.argv[1], sys.argv[2]
h = hashlib.sha256(root.encode())
for path in (os.path.join(root, "pyproject.toml"), this):
    with open(path, "rb") as f:
        h.update(f.read())
for pkg in ("fsdp_course", "quizzes"):
    h.update(f"{pkg}:{os.path.isfile(os.path.join(root, pkg, '__init__.py'))}".encode())
print(h.hexdigest())
PY
)
if [[ "${SETUP_FORCE:-0}" != "1" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    [[ "$QUIET" == "1" ]] || say "up to date ($VENV); nothing to install"
    exit 0
fi
rm -f "$STAMP"

# 3. torch ----------------------------------------------------------------------------------
# Read the installed version from package metadata (importing torch takes seconds).
TORCH_HAVE=$("$VPY" - <<'PY'
import importlib.metadata as md
try:
    print(md.version("torch"))
except md.PackageNotFoundError:
    print("")
PY
)
if [[ -z "$TORCH_HAVE" ]]; then
    say "installing $TORCH_SPEC (no torch in the venv yet)"
    # shellcheck disable=SC2086  # TORCH_SPEC may carry pip options such as --index-url
    run_pip install $TORCH_SPEC
elif "$VPY" -c 'import re, sys; m = re.match(r"(\d+)\.(\d+)", sys.argv[1]); sys.exit(not m or (int(m[1]), int(m[2])) < (2, 13))' "$TORCH_HAVE"; then
    say "keeping torch $TORCH_HAVE (already >= 2.13)"
else
    die "the venv has torch $TORCH_HAVE; the course needs torch >= 2.13. Upgrade it, then rerun this script:
    $VPY -m pip install --upgrade 'torch==2.13.0'
  (GPU: add the --index-url for your CUDA version from https://pytorch.org/get-started/locally/)"
fi

# A pip that is too old for editable installs of a pyproject.toml-only project (< 21.3).
if ! "$VPY" -c 'import sys, importlib.metadata as md; sys.exit(tuple(int(x) for x in md.version("pip").split(".")[:2]) < (21, 3))' 2>/dev/null; then
    say "upgrading pip (editable installs need pip >= 21.3)"
    run_pip install --upgrade 'pip>=21.3'
fi

# 4. The course and its tools ------------------------------------------------------------------
say "installing the course and its test tools: pip install -e '$ROOT[test]'"
run_pip install -e "$ROOT[test]"

echo "$WANT" >"$STAMP"
TORCH_NOW=$("$VPY" -c 'import importlib.metadata as md; print(md.version("torch"))')
say "ready in $((SECONDS - START)) s: $VENV (Python $("$VPY" -c 'import platform; print(platform.python_version())'), torch $TORCH_NOW)"
