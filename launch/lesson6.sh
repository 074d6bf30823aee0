#!/usr/bin/env bash
# Lesson 6: the silent bugs. Flags pass to train.py (try --help, --launcher-help).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
run_lesson 6 "$@"
