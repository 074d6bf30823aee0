#!/usr/bin/env bash
# Lesson 1: classic FSDP sharding strategies. Flags pass to train.py (try --help, --launcher-help).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
run_lesson 1 "$@"
