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
        [str(a) for a in args],
        cwd=cwd or REPO_ROOT,
        env=full_env,
        input=input,
        text=True,
        capture_output=True,
        timeout=timeout,
    )


def quiz_cli(*args, progress_file, stdin="", env=None) -> subprocess.CompletedProcess:
    """``python -m quizzes args...`` with its progress in ``progress_file``, ``stdin`` typed in."""
    return run_cmd(
        [sys.executable, "-m", "quizzes", *args],
        env={PROGRESS_ENV: progress_file, **(env or {})},
        input=stdin,
    )


def use_bank(authoring: dict, folder: Path, monkeypatch) -> str:
    """Seal ``authoring`` (the plain form ``python -m quizzes unseal`` prints) as the only bank in
    ``folder`` and point the quiz engine at that folder; returns the bank's lesson id."""
    from quizzes import bank

    folder.mkdir(parents=True)
    lesson = authoring["lesson"]
    (folder / f"{lesson}.json").write_text(bank.dump_bank(bank.from_authoring(authoring)))
    monkeypatch.setenv(bank.BANK_PATH_ENV, str(folder))
    return lesson


def lesson_script(lesson: int, name: str = "train"):
    """``lessons/NN_*/name.py`` imported as a module, as torchrun runs it: its folder first on
    the path, so ``import runs`` finds this lesson's module and not another lesson's of the
    same name (those are set aside and put back). Tests call the script's own functions (its
    flag parser, its checks) in-process this way instead of paying for a launch."""
    import importlib.util

    folder = next((REPO_ROOT / "lessons").glob(f"{lesson:02d}_*"))
    siblings = [p.stem for p in folder.glob("*.py")]
    others = {n: sys.modules.pop(n) for n in siblings if n in sys.modules}
    sys.path.insert(0, str(folder))
    try:
        spec = importlib.util.spec_from_file_location(
            f"lesson{lesson}_{name}", folder / f"{name}.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(folder))
        for n in siblings:
            sys.modules.pop(n, None)
        sys.modules.update(others)
    return module
