"""The test run's cache of lesson launches, a pytest plugin (tests/conftest.py registers it).

A launch with the same lesson, flags, NPROC and environment runs once per test run: the
notebook's test and the script's tests assert on the same run instead of starting torchrun
twice. The controller makes one folder before the xdist workers start; the workers and every
notebook kernel inherit it through the environment:

- ``COURSE_RUN_CACHE``: the folder; one JSON file per finished launch, written under a lock
  (a second caller waits for the first one's run, then reads it);
- ``COURSE_LAUNCHER``: this file's ``cached_launch``, which ``course_lab.notebook.launch_lesson``
  hands every launch to (course_lab itself keeps no cache);
- ``COURSE_SHARER``: this file's ``cached_call``, which ``course_lab.notebook.shared_run`` hands a
  named run of lesson code to (lesson 8's jobs: a hang dumped by py-spy, two nodes), shared the
  same way;
- ``COURSE_LAUNCH_LOG``: one line per torchrun start (fsdp_course.torchrun writes it), counted
  in the summary line "torchrun launches: N (M lesson launches shared through the run cache)".

Every process the tests start (1-rank launches, notebook kernels) also gets one OpenMP thread,
as torchrun gives each of several ranks: the suite keeps both cores busy with two workers, so a
second thread only spins while it waits for work (a 1-rank launch cost about twice the CPU
seconds with it).
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

CACHE_ENV = "COURSE_RUN_CACHE"
LOG_ENV = "COURSE_LAUNCH_LOG"
LAUNCHER_ENV = "COURSE_LAUNCHER"  # read by course_lab.notebook
SHARER_ENV = "COURSE_SHARER"  # read by course_lab.notebook
VARIABLES = (CACHE_ENV, LOG_ENV, LAUNCHER_ENV, SHARER_ENV)


def cached_launch(lesson: int, args: list[str], nproc, env: dict | None, launch):
    """``launch()`` once per (lesson, flags, NPROC, environment) in this test run; later
    callers, in any process, get the finished run from the cache folder."""
    from course_lab.notebook import LessonRun

    root = os.environ.get(CACHE_ENV)
    if not root:
        return launch()
    key = json.dumps([lesson, args, str(nproc), sorted((env or {}).items())], default=str)
    return _once(
        Path(root) / f"lesson{lesson}-{_digest(key, 20)}.json",
        lambda: dataclasses.asdict(launch()),
        lambda held: LessonRun(**held),
    )


def cached_call(name: str, fn, args: tuple, kwargs: dict):
    """``fn(*args, **kwargs)`` once per (name, arguments) in this test run, as JSON holds it
    (what every later caller, in any process, gets)."""
    root = os.environ.get(CACHE_ENV)
    if not root:
        return fn(*args, **kwargs)
    key = json.dumps([name, args, sorted(kwargs.items())], default=str)
    return _once(
        Path(root) / f"{name}-{_digest(key, 16)}.json",
        lambda: json.loads(json.dumps(fn(*args, **kwargs), default=str)),
        lambda held: held,
    )


def _digest(key: str, length: int) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:length]


def _once(path: Path, make, load):
    """``load`` of what ``make()`` returned, made by the first caller only: the others wait on the
    lock, then read the file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.is_file():
            path.write_text(json.dumps(make()))
        return load(json.loads(path.read_text()))


def start(folder: str) -> dict:
    """Point this process's environment (and so every child's) at a run cache in ``folder``;
    return the variables' earlier values for ``stop``."""
    saved = {name: os.environ.get(name) for name in VARIABLES}
    os.environ[CACHE_ENV] = folder
    os.environ[LOG_ENV] = os.path.join(folder, "launches.log")
    os.environ[LAUNCHER_ENV] = f"{Path(__file__).resolve()}:cached_launch"
    os.environ[SHARER_ENV] = f"{Path(__file__).resolve()}:cached_call"
    return saved


def stop(folder: str, saved: dict) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    restore(saved)


def restore(saved: dict) -> None:
    """Put environment variables back to ``saved`` ({name: value, or None for unset})."""
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def summary(folder: str) -> str:
    """How many torchrun launches the run made (fsdp_course.torchrun notes each one) and how
    many lesson launches it shared."""
    try:
        with open(os.path.join(folder, "launches.log")) as log:
            launches = log.read().splitlines()
    except FileNotFoundError:
        launches = []
    cached = len([name for name in os.listdir(folder) if name.endswith(".json")])
    return (
        f"torchrun launches: {len(launches)} "
        f"({cached} lesson launches shared through the run cache)"
    )


def pytest_configure(config):
    """Made by the controller before the workers start; a worker (or a pytest run inside one)
    finds it already set."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if os.environ.get("PYTEST_XDIST_WORKER") or os.environ.get(CACHE_ENV):
        return
    folder = tempfile.mkdtemp(prefix="fsdp-course-runs-")
    config._course_run_cache = (folder, start(folder))


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "_course_run_cache"):
        terminalreporter.write_line(summary(config._course_run_cache[0]))


def pytest_unconfigure(config):
    if hasattr(config, "_course_run_cache"):
        stop(*config._course_run_cache)
