#!/usr/bin/env bash
# Lesson 9: your model (a Hugging Face model on FSDP2; DeepSpeed ZeRO beside it). Flags pass to
# train.py (try --help, --launcher-help).
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"
run_lesson 9 "$@"
