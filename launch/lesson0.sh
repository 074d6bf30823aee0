#!/usr/bin/env bash
# Lesson 0: torchrun, process groups, the DDP baseline. Flags pass to train.py (try --help, --launcher-help).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
run_lesson 0 "$@"
