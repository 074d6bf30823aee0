"""Shared fixtures: the repository root, running commands and launchers, a private quiz
progress file. Kept small and generic; lesson tests add their own helpers."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.fixture(autouse=True, scope="session")
def _private_progress(tmp_path_factory):
    """Tests never touch the learner's own quiz progress file."""
    saved = os.environ.get(PROGRESS_ENV)
    os.environ[PROGRESS_ENV] = str(tmp_path_factory.mktemp("progress") / "progress.json")
    yield
    if saved is None:
        os.environ.pop(PROGRESS_ENV, None)
    else:
        os.environ[PROGRESS_ENV] = saved


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(name="run_cmd")
def run_cmd_fixture():
    """The ``run_cmd`` helper as a fixture."""
    return run_cmd


@pytest.fixture
def run_launcher():
    """run_launcher("lesson1.sh", "--steps", "3", env={"NPROC": "2"}, timeout=300):
    ``bash launch/<name> args...`` from the repo root, as CompletedProcess."""
    def run(name, *args, env=None, timeout=300, cwd=None):
        return run_cmd(["bash", REPO_ROOT / "launch" / name, *args], env=env, timeout=timeout, cwd=cwd)
    return run


@pytest.fixture
def progress_file(tmp_path, monkeypatch) -> Path:
    """A private quiz progress file (set in os.environ, so subprocesses see it too)."""
    path = tmp_path / "progress.json"
    monkeypatch.setenv(PROGRESS_ENV, str(path))
    return path
