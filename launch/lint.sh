#!/usr/bin/env bash
# launch/lint.sh: ruff over the repository, with the settings in pyproject.toml.
#
#   bash launch/lint.sh              # fix what ruff fixes safely, format, then list what is left
#   bash launch/lint.sh --check      # change nothing: what tests/test_tooling.py checks
#   bash launch/lint.sh ruff ARGS    # just `ruff ARGS` with the course's Python (the pre-commit
#                                    # hooks in .pre-commit-config.yaml call this)
#
# What is left after a fix run needs a person: long strings and comments (E501; the formatter
# never splits a string), unused imports (F401: delete, or `# noqa: F401` when the import
# registers something), ambiguous names (E741), bugbear findings (B...).
# The Python: $PYTHON, else the active virtual environment's, else .venv's, else python3; ruff
# comes with the test extra (pip install -e '.[test]', which launch/setup.sh does).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

mode=fix
case "${1:-}" in
    "") ;;
    --check) mode=check; shift ;;
    ruff) mode=ruff; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "lint.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
esac
if [[ $mode != ruff && $# -gt 0 ]]; then
    echo "lint.sh: unknown argument '$1' (try --help)" >&2; exit 2
fi

PY="$(course_python)"
if ! "$PY" -m ruff --version >/dev/null 2>&1; then
    echo "lint.sh: no ruff for $PY; install the test extra: $PY -m pip install -e '$COURSE_ROOT[test]'" >&2
    exit 2
fi
if [[ $mode == ruff ]]; then
    exec "$PY" -m ruff "$@"
fi

cd "$COURSE_ROOT"
if [[ $mode == check ]]; then
    rc=0
    "$PY" -m ruff check . || rc=1
    "$PY" -m ruff format --check . || rc=1
    exit "$rc"
fi
"$PY" -m ruff check --fix --exit-zero --quiet .
"$PY" -m ruff format --quiet .
# the count per rule of what is left; exit status 1 while anything is
"$PY" -m ruff check --statistics .
