#!/usr/bin/env bash
# Lesson 5: FSDP2 (fully_shard). Flags pass to train.py (try --help, --launcher-help).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
run_lesson 5 "$@"
