"""The repository is clean under its own ruff settings (pyproject.toml), and the tools that keep
it so work: launch/lint.sh, launch/notebooks.py, the pre-commit hooks, nbval on the lessons.
Every lesson folder names its files by one scheme (README, "How the course is built")."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from helpers import REPO_ROOT, run_cmd

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

yaml = pytest.importorskip("yaml")
needs_ruff = pytest.mark.skipif(
    importlib.util.find_spec("ruff") is None,
    reason="ruff is not installed (it comes with the test extra: pip install -e '.[test]')",
)


def pinned_ruff() -> str:
    extra = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["test"]
    return next(req for req in extra if req.startswith("ruff==")).split("==")[1]


def installed_ruff() -> str | None:
    try:
        return importlib.metadata.version("ruff")
    except importlib.metadata.PackageNotFoundError:
        return None


# Another ruff version flags and formats differently: the cleanliness checks need the pinned one.
needs_pinned_ruff = pytest.mark.skipif(
    installed_ruff() not in (None, pinned_ruff()),
    reason=f"ruff {installed_ruff()} is installed, pyproject.toml pins {pinned_ruff()} "
    "(pip install -e '.[test]')",
)


def ruff(*args):
    return run_cmd([sys.executable, "-m", "ruff", *args], timeout=120)


def head(text: str, lines: int = 60) -> str:
    kept = text.splitlines()
    more = f"\n... and {len(kept) - lines} more lines" if len(kept) > lines else ""
    return "\n".join(kept[:lines]) + more


@needs_ruff
@needs_pinned_ruff
def test_ruff_check_is_clean():
    r = ruff("check", "--output-format", "concise", ".")
    assert r.returncode == 0, (
        "ruff check found problems (`bash launch/lint.sh` fixes what it can, then lists the "
        f"rest):\n{head(r.stdout + r.stderr)}"
    )


@needs_ruff
@needs_pinned_ruff
def test_ruff_format_is_clean():
    r = ruff("format", "--check", "--output-format", "concise", ".")
    assert r.returncode == 0, (
        f"ruff format would change files (bash launch/lint.sh):\n{head(r.stdout + r.stderr)}"
    )


@needs_ruff
def test_the_repository_settings_are_the_ones_ruff_uses():
    """pyproject.toml's [tool.ruff] governs, not ruff's defaults or a config found elsewhere:
    the line length and rule selection ruff reports are the ones written there."""
    settings = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    r = ruff("check", "--show-settings", "fsdp_course/__init__.py")
    assert r.returncode == 0, r.stderr
    assert f"linter.line_length = {settings['line-length']}\n" in r.stdout
    enabled = r.stdout.split("linter.rules.enabled = [", 1)[1].split("]", 1)[0]
    codes = {line.rsplit("(", 1)[1].rstrip("),\n") for line in enabled.strip().splitlines()}
    assert not any(code.startswith(("SIM", "S1", "RUF0")) for code in codes), sorted(codes)
    assert {"E501", "F401", "I001", "B006", "UP006", "RUF100"} <= codes


def notebook(outputs: bool) -> dict:
    cell = {
        "cell_type": "code",
        "id": "a1",
        "metadata": {},
        "source": ["print(1)\n"],
        "outputs": [],
        "execution_count": None,
    }
    if outputs:
        cell["outputs"] = [{"name": "stdout", "output_type": "stream", "text": ["1\n"]}]
        cell["execution_count"] = 3
    return {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def test_notebook_check_fails_on_outputs_and_strip_clears_them(tmp_path):
    dirty, clean = tmp_path / "dirty.ipynb", tmp_path / "clean.ipynb"
    dirty.write_text(json.dumps(notebook(outputs=True)))
    clean.write_text(json.dumps(notebook(outputs=False)))
    script = REPO_ROOT / "launch" / "notebooks.py"

    r = run_cmd([sys.executable, script, "--check", dirty, clean])
    assert r.returncode == 1
    assert "dirty.ipynb: outputs or execution counts in code cells [0]" in r.stderr
    assert "clean.ipynb" not in r.stderr

    r = run_cmd([sys.executable, script, "--strip", dirty])
    assert r.returncode == 0, r.stderr
    assert json.loads(dirty.read_text()) == notebook(outputs=False)
    assert run_cmd([sys.executable, script, "--check", dirty, clean]).returncode == 0

    r = run_cmd([sys.executable, script, "--check"])  # no arguments: the lessons' notebooks
    assert r.returncode == 0, r.stderr
    r = run_cmd([sys.executable, script, "--check", tmp_path / "missing.ipynb"])
    assert r.returncode == 1 and "not a readable notebook" in r.stderr


def test_pre_commit_hooks_are_local():
    """pre-commit cannot fetch hook repositories here: every hook is local, ruff runs through
    launch/lint.sh (the course's Python, the ruff the test extra pins), the notebook check is
    launch/notebooks.py."""
    config = yaml.safe_load((REPO_ROOT / ".pre-commit-config.yaml").read_text())
    assert {repo["repo"] for repo in config["repos"]} == {"local"}
    hooks = {h["id"]: h for repo in config["repos"] for h in repo["hooks"]}
    assert hooks["ruff-check"]["entry"].startswith("bash launch/lint.sh ruff check")
    assert hooks["ruff-format"]["entry"].startswith("bash launch/lint.sh ruff format")
    assert "launch/notebooks.py --check" in hooks["notebooks-without-outputs"]["entry"]
    extra = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["test"]
    assert any(req.startswith("ruff==") for req in extra), extra


@needs_ruff
def test_lint_script_runs_ruff_with_the_course_python():
    r = run_cmd(["bash", REPO_ROOT / "launch" / "lint.sh", "ruff", "--version"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ruff ")


def test_lint_script_refuses_unknown_flags():
    r = run_cmd(["bash", REPO_ROOT / "launch" / "lint.sh", "--fix-everything"])
    assert r.returncode == 2
    assert r.stderr.strip() == "lint.sh: unknown argument '--fix-everything' (try --help)"


@needs_ruff
def test_lint_fix_keeps_reasons_and_names_what_needs_a_person(tmp_path):
    """`bash launch/lint.sh` on a copy: a `# noqa` that suppresses nothing goes and its reason
    stays a comment; one that is needed stays; an unused import is reported, not deleted; a
    docstring whose example the formatter re-indents is named."""
    (tmp_path / "launch").mkdir()
    for name in ("lint.sh", "_common.sh"):
        shutil.copy(REPO_ROOT / "launch" / name, tmp_path / "launch" / name)
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    source = (
        "import json  # noqa: F401 - registers nothing, kept on purpose\n"
        "import os\n"
        "\n"
        "\n"
        "def f():\n"
        "    try:\n"
        "        return 1\n"
        "    except Exception:  # noqa: BLE001 - one line, not a traceback\n"
        "        return 2  # noqa: E501\n"
        "\n"
        "\n"
        "def g():\n"
        '    """Say hello:\n'
        "\n"
        "        g()\n"
        '    """\n'
    )
    (tmp_path / "sample.py").write_text(source)
    assert run_cmd(["git", "init", "-q"], cwd=tmp_path).returncode == 0
    assert run_cmd(["git", "add", "sample.py"], cwd=tmp_path).returncode == 0
    r = run_cmd(["bash", tmp_path / "launch" / "lint.sh"], cwd=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr  # the unused `import os` is left to a person
    assert "sample.py: 2 unused noqa removed" in r.stdout
    assert "sample.py: g: the formatter re-indented this docstring" in r.stdout
    assert "F401" in r.stdout
    assert (tmp_path / "sample.py").read_text() == (
        "import json  # noqa: F401 - registers nothing, kept on purpose\n"
        "import os\n"
        "\n"
        "\n"
        "def f():\n"
        "    try:\n"
        "        return 1\n"
        "    except Exception:  # one line, not a traceback\n"
        "        return 2\n"
        "\n"
        "\n"
        "def g():\n"
        '    """Say hello:\n'
        "\n"
        "    g()\n"
        '    """\n'
    )


@pytest.mark.skipif(
    importlib.util.find_spec("nbval") is None,
    reason="nbval is not installed (it comes with the test extra: pip install -e '.[test]')",
)
def test_nbval_collects_every_lesson_notebook_and_nothing_else():
    r = run_cmd(
        [
            sys.executable,
            "-m",
            "pytest",
            "--nbval-lax",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "lessons/",
        ]
    )
    assert r.returncode == 0, r.stdout + r.stderr
    items = [line for line in r.stdout.splitlines() if "::" in line]
    collected = {line.split("::")[0] for line in items}
    notebooks = {
        str(p.relative_to(REPO_ROOT))
        for p in (REPO_ROOT / "lessons").rglob("*.ipynb")
        if ".ipynb_checkpoints" not in p.parts
    }
    assert collected == notebooks
    assert all("::Cell " in line for line in items)


def test_nbval_kernels_get_the_suites_environment(monkeypatch):
    """lessons/conftest.py: with --nbval(-lax) the kernels find this repository first, use one
    OpenMP thread and a private progress file; afterwards everything is as before. Without
    nbval it changes nothing."""
    spec = importlib.util.spec_from_file_location(
        "lessons_conftest", REPO_ROOT / "lessons" / "conftest.py"
    )
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)

    class Config:
        def __init__(self, nbval: bool):
            self.nbval = nbval

        def getoption(self, name, default=None):
            return self.nbval and name == "nbval_lax"

    names = (
        "OMP_NUM_THREADS",
        conftest.PROGRESS_ENV,
        "COURSE_RUN_CACHE",
        "COURSE_LAUNCH_LOG",
        "COURSE_LAUNCHER",
    )
    for name in names:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")

    plain = Config(nbval=False)
    conftest.pytest_configure(plain)
    assert os.environ["PYTHONPATH"] == "/elsewhere"
    assert not any(name in os.environ for name in names)

    config = Config(nbval=True)
    conftest.pytest_configure(config)
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(REPO_ROOT), "/elsewhere"]
    assert os.environ["OMP_NUM_THREADS"] == "1"
    folder = Path(os.environ["COURSE_RUN_CACHE"]).parent
    assert folder.is_dir() and Path(os.environ[conftest.PROGRESS_ENV]).parent == folder
    assert os.environ["COURSE_LAUNCHER"].endswith("tests/run_cache.py:cached_launch")
    conftest.pytest_unconfigure(config)
    assert not folder.exists()
    assert os.environ["PYTHONPATH"] == "/elsewhere"
    assert not any(name in os.environ for name in names)


# --- one naming scheme in every lesson folder -------------------------------------------------

LESSON_FOLDERS = sorted(p for p in (REPO_ROOT / "lessons").glob("[0-9][0-9]_*") if p.is_dir())
# Named for a position, a role other than runs.py, or the lesson: it does not say what it holds.
VAGUE_NAME = re.compile(r"(part_|lesson\d|.*(plumbing|helpers?|utils?|misc|common|stuff)\b)")


def test_there_are_lesson_folders():
    assert len(LESSON_FOLDERS) >= 10


@pytest.mark.parametrize("folder", LESSON_FOLDERS, ids=lambda p: p.name)
def test_lesson_folder_follows_the_naming_scheme(folder):
    """``NN_topic.ipynb`` (the one notebook), ``train.py`` (the torchrun script, at most 200
    lines), and every other module named for its subject, opening with a docstring that says
    what it holds."""
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    assert [n for n in names if n.endswith(".ipynb")] == [f"{folder.name}.ipynb"], names
    train = folder / "train.py"
    assert train.is_file(), names
    length = len(train.read_text().splitlines())
    assert length <= 200, f"{train.relative_to(REPO_ROOT)}: {length} lines (at most 200)"
    assert not [n for n in names if VAGUE_NAME.match(n)], names
    for module in folder.glob("*.py"):
        assert ast.get_docstring(ast.parse(module.read_text())), f"{module.name}: no docstring"


@pytest.mark.parametrize("folder", LESSON_FOLDERS, ids=lambda p: p.name)
def test_lesson_modules_shadow_nothing(folder):
    """A script's folder comes first on its path (torchrun runs it there), so a lesson module
    named like a standard or installed module would replace it for that script."""
    for module in folder.glob("*.py"):
        assert module.stem not in sys.stdlib_module_names, module.name
        spec = importlib.util.find_spec(module.stem)
        origin = Path(spec.origin) if spec is not None and spec.origin else None
        # Another lesson's module of the same name (runs.py) may be on the path already: fine.
        assert origin is None or origin.is_relative_to(REPO_ROOT / "lessons"), (module, origin)
