"""For instructors: `pytest --nbval-lax lessons/` runs every notebook top to bottom and fails on
the first cell that raises (nbval; README, "Checking the notebooks"). The test suite itself
(`bash launch/test.sh`) never collects lessons/: tests/test_notebooks.py runs each notebook
once and grades the solutions too.

The kernels nbval starts inherit this environment, as the suite's do (tests/conftest.py): this
repository first on the path (the ranks get it too, course_lab.notebook.lesson_env), one
OpenMP thread per process, a private quiz progress file (checking the notebooks records no
quiz result of yours), and the suite's run cache (tests/run_cache.py) for this pytest run, so
a launch the same flags repeat runs once."""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROGRESS_ENV = "FSDP_COURSE_PROGRESS"  # quizzes/progress.py reads it


def run_cache():
    """tests/run_cache.py, loaded from its file (tests/ is not a package)."""
    path = REPO / "tests" / "run_cache.py"
    spec = importlib.util.spec_from_file_location("course_run_cache", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pytest_configure(config):
    if not (config.getoption("nbval", False) or config.getoption("nbval_lax", False)):
        return
    saved = {name: os.environ.get(name) for name in ("PYTHONPATH", "OMP_NUM_THREADS", PROGRESS_ENV)}
    folder = tempfile.mkdtemp(prefix="fsdp-course-nbval-")
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), path]))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ[PROGRESS_ENV] = os.path.join(folder, "progress.json")
    cache = run_cache()
    runs = os.path.join(folder, "runs")
    os.makedirs(runs)
    config._course_nbval = (folder, saved, cache, runs, cache.start(runs))


def pytest_terminal_summary(terminalreporter, config):
    if hasattr(config, "_course_nbval"):
        _, _, cache, runs, _ = config._course_nbval
        terminalreporter.write_line(cache.summary(runs))


def pytest_unconfigure(config):
    if not hasattr(config, "_course_nbval"):
        return
    folder, saved, cache, runs, cache_saved = config._course_nbval
    cache.stop(runs, cache_saved)
    shutil.rmtree(folder, ignore_errors=True)
    cache.restore(saved)
