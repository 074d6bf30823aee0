"""Shared fixtures: the repository root, running commands and launchers, a private quiz
progress file; one cache of lesson launches per test run (the plugin tests/run_cache.py). Kept
small and generic; lesson tests add their own helpers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers import PROGRESS_ENV, REPO_ROOT, run_cmd

pytest_plugins = ["run_cache"]  # one launch per (lesson, flags, NPROC, env) per test run


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
        return run_cmd(
            ["bash", REPO_ROOT / "launch" / name, *args], env=env, timeout=timeout, cwd=cwd
        )

    return run


@pytest.fixture
def progress_file(tmp_path, monkeypatch) -> Path:
    """A private quiz progress file (set in os.environ, so subprocesses see it too)."""
    path = tmp_path / "progress.json"
    monkeypatch.setenv(PROGRESS_ENV, str(path))
    return path


# The order in which the two workers take the groups: the longest first (from a fresh-clone
# run of the whole suite, seconds per group with its notebook: lesson8 158, lesson9 (new; about
# 150 on a busy machine, not yet measured in a whole-suite run), lesson7 152,
# lesson4 126, lesson5 116, lesson6 77, browser 67, lesson2 66, lesson3 64, lesson1 61, library
# 50, lesson0 49, slurm 26, plan 4; everything else under 15). A long group taken last keeps one
# worker busy while the other idles; taken first, the short ones fill in around it. Scheduling
# only: no test depends on it.
LONGEST_FIRST = (
    "lesson8",
    "lesson9",
    "lesson7",
    "lesson4",
    "lesson5",
    "lesson6",
    "test_browser",
    "lesson2",
    "lesson3",
    "lesson1",
    "test_library",
    "lesson0",
    "test_slurm",
    "test_plan",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Group tests for pytest-xdist (``--dist loadgroup --no-loadscope-reorder`` in
    launch/test.sh): a lesson's script tests and its notebook run on one worker, one after the
    other, so the launches they share (tests/run_cache.py) run once and nobody waits on the
    other worker; any other file stays whole on one worker (its module fixtures run once).
    Groups are ordered longest first (LONGEST_FIRST), the rest after them as collected."""
    groups = {}
    for item in items:
        module = item.path.stem
        group = module
        if module.startswith("test_lesson") and module[len("test_lesson") :].isdigit():
            group = f"lesson{int(module[len('test_lesson') :])}"
        elif module == "test_notebooks" and hasattr(item, "callspec"):
            folder = item.callspec.params["path"].parent.name
            if folder[:2].isdigit():
                group = f"lesson{int(folder[:2])}"
        item.add_marker(pytest.mark.xdist_group(group))
        groups[item] = group
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(groups[item], len(rank)))  # stable: files keep their order
