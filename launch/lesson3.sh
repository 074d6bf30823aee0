#!/usr/bin/env bash
# Lesson 3: no_sync and gradient accumulation. Flags pass to train.py (try --help, --launcher-help).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
run_lesson 3 "$@"
