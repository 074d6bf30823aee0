#!/usr/bin/env bash
# Lesson 8: troubleshooting and scale-out. Flags pass to train.py (try --help, --launcher-help).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
run_lesson 8 "$@"
