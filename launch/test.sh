#!/usr/bin/env bash
# launch/test.sh: set up (quietly, when nothing changed), then run the course's tests.
#
#   bash launch/test.sh                 # everything
#   bash launch/test.sh -m "not slow"   # pytest arguments pass through
#   bash launch/test.sh tests/test_launch.py -x
#
# PYTHON set: use that interpreter and skip launch/setup.sh; else the venv at ${VENV:-.venv}.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

if [[ -n "${PYTHON:-}" ]]; then
    PY="$PYTHON"
else
    VENV="${VENV:-$COURSE_ROOT/.venv}"
    export VENV
    bash "$COURSE_ROOT/launch/setup.sh" --quiet
    PY="$VENV/bin/python"
    # The tests start launchers; make them use the same interpreter.
    export PYTHON="$PY"
fi
course_export_pythonpath
cd "$COURSE_ROOT"
exec "$PY" -m pytest "$@"
