"""Run a lesson script under torchrun through its launcher and return its metrics (for tests)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from helpers import run_cmd

REPO = Path(__file__).resolve().parents[1]


def launch(lesson: int, *args, nproc: int = 2, tmp: Path, env: dict | None = None,
           timeout: int = 600):
    """``NPROC=nproc bash launch/lessonN.sh args --metrics tmp/...``; returns (process, metrics)."""
    metrics = tmp / f"lesson{lesson}-n{nproc}-{abs(hash(args))}.json"
    proc = run_cmd(["bash", REPO / "launch" / f"lesson{lesson}.sh", *map(str, args),
                    "--metrics", metrics],
                   env={"NPROC": nproc, "PYTHON": sys.executable, **(env or {})}, timeout=timeout)
    data = json.loads(metrics.read_text()) if metrics.exists() else None
    return proc, data


def ok(proc) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
