"""For instructors: `pytest --nbval-lax lessons/` runs every notebook top to bottom and fails on
the first cell that raises (nbval; README, "Checking the notebooks"). The test suite itself
(`bash launch/test.sh`) never collects lessons/: tests/test_notebooks.py runs each notebook
once and grades the solutions too.

The kernels nbval starts inherit this environment, as the suite's do (tests/conftest.py): this
repository first on the path (the ranks get it too, course_lab.notebook.launch_env), one
OpenMP thread per process, a private quiz progress file (checking the notebooks records no
quiz result of yours), and one run cache per pytest run, so a launch the same flags repeat
runs once."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROGRESS_ENV = "FSDP_COURSE_PROGRESS"  # quizzes/progress.py reads it


def pytest_configure(config):
    if not (config.getoption("nbval", False) or config.getoption("nbval_lax", False)):
        return
    saved = {
        name: os.environ.get(name)
        for name in (
            "PYTHONPATH",
            "OMP_NUM_THREADS",
            PROGRESS_ENV,
            "COURSE_RUN_CACHE",
            "COURSE_LAUNCH_LOG",
        )
    }
    folder = tempfile.mkdtemp(prefix="fsdp-course-nbval-")
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), path]))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ[PROGRESS_ENV] = os.path.join(folder, "progress.json")
    os.environ["COURSE_RUN_CACHE"] = os.path.join(folder, "runs")
    os.environ["COURSE_LAUNCH_LOG"] = os.path.join(folder, "launches.log")
    os.makedirs(os.environ["COURSE_RUN_CACHE"])
    config._course_nbval = (folder, saved)


def pytest_unconfigure(config):
    folder, saved = getattr(config, "_course_nbval", (None, {}))
    if folder is None:
        return
    shutil.rmtree(folder, ignore_errors=True)
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
