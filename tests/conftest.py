"""Shared fixtures: the repository root, running commands and launchers, a private quiz
progress file. Kept small and generic; lesson tests add their own helpers."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import PROGRESS_ENV, REPO_ROOT, run_cmd


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
