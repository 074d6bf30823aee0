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

course_setup_python
export PYTHON="$PY"  # the tests start launchers: they must use the same interpreter
course_export_pythonpath
cd "$COURSE_ROOT"

# Two pytest workers (pytest-xdist) by group (tests/conftest.py): a lesson's script tests and
# its notebook on one worker, so the launches they share run once; any other file whole. Most
# of a launch is Python importing torch in every rank, and two workers keep both cores busy
# while one waits; the longest groups go first (tests/conftest.py). TEST_WORKERS=1 runs
# serially; an explicit -n/--numprocesses in the arguments wins.
workers="${TEST_WORKERS:-2}"
if ! course_is_posint "$workers"; then
    echo "test.sh: TEST_WORKERS must be a positive integer, got '$workers'" >&2; exit 2
fi
parallel=()
case " $* " in
    *" -n "*|*" -n"[0-9]*|*" --numprocesses"*|*" -p no:xdist "*) ;;
    *) if [[ "$workers" -gt 1 ]]; then parallel=(-n "$workers" --dist loadgroup --no-loadscope-reorder); fi ;;
esac
exec "$PY" -m pytest ${parallel[@]+"${parallel[@]}"} "$@"
