#!/usr/bin/env bash
# Lesson 7: memory (planner, limits, activation checkpointing, offload). Flags pass to train.py (try --help, --launcher-help).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
run_lesson 7 "$@"
