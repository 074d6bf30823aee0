#!/usr/bin/env bash
# launch/bench.sh: time every lesson notebook (budget: 60 s each) and every lesson script (the
# launches its launches.toml marks bench = true: the launcher's defaults, NPROC=2), then print a
# table and the total.
#
#   bash launch/bench.sh
#   BENCH_ONLY=lesson1 bash launch/bench.sh     # one lesson (comma-separated list allowed)
#
# Runs in a temporary copy of the repository: nothing is written into the repo.
# PYTHON set: use that interpreter and skip launch/setup.sh; else the venv at ${VENV:-.venv}.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

course_setup_python
exec "$PY" "$COURSE_ROOT/launch/bench.py"
