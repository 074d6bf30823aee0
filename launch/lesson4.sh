#!/usr/bin/env bash
# Lesson 4: checkpointing (state dicts, DCP). Flags pass to train.py (try --help, --launcher-help).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
# --crash-at-step kills a rank on purpose: allow one restart unless MAX_RESTARTS says otherwise.
for arg in "$@"; do
    if [[ "$arg" == --crash-at-step || "$arg" == --crash-at-step=* ]]; then
        export MAX_RESTARTS="${MAX_RESTARTS:-1}"
    fi
done
run_lesson 4 "$@"
