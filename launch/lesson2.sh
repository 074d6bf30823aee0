#!/usr/bin/env bash
# Lesson 2: wrap policies. Flags pass to train.py (try --help, --launcher-help).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
run_lesson 2 "$@"
