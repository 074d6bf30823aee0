"""Helpers the tests import (``from helpers import run_cmd``). Not in conftest.py: a second
conftest (lessons/conftest.py) would make ``from conftest import ...`` ambiguous."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
# Where the quizzes keep progress (quizzes/progress.py reads this variable).
PROGRESS_ENV = "FSDP_COURSE_PROGRESS"


def run_cmd(args, env=None, timeout=120, cwd=None, input=None) -> subprocess.CompletedProcess:
    """Run ``args`` (from the repo root unless ``cwd``), capture text output, never raise on a
    non-zero exit. ``env`` updates os.environ; a value of None removes that variable."""
    full_env = dict(os.environ)
    # Launchers should run the interpreter that runs the tests.
    full_env.setdefault("PYTHON", sys.executable)
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = str(value)
    return subprocess.run(
        [str(a) for a in args], cwd=cwd or REPO_ROOT, env=full_env, input=input,
        text=True, capture_output=True, timeout=timeout,
    )
