"""pyproject.toml and environment.yml list the same requirements; notebooks are stored clean."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from helpers import REPO_ROOT

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")
yaml = pytest.importorskip("yaml")


def pyproject() -> dict:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def environment() -> dict:
    return yaml.safe_load((REPO_ROOT / "environment.yml").read_text())


def by_name(lines) -> dict[str, SpecifierSet]:
    reqs = [Requirement(line) for line in lines]
    names = [canonicalize_name(r.name) for r in reqs]
    assert len(set(names)) == len(names), f"duplicate requirement in {lines}"
    return {canonicalize_name(r.name): r.specifier for r in reqs}


def conda_pip_list() -> list[str]:
    pip_sections = [
        d["pip"] for d in environment()["dependencies"] if isinstance(d, dict) and "pip" in d
    ]
    assert len(pip_sections) == 1, "environment.yml needs exactly one pip: section"
    return pip_sections[0]


def test_pyproject_basics():
    project = pyproject()["project"]
    assert project["name"] == "fsdp-course"
    assert SpecifierSet(project["requires-python"]) == SpecifierSet(">=3.10")
    names = set(by_name(project["dependencies"]))
    for needed in [
        "torch",
        "jupyterlab",
        "ipykernel",
        "ipywidgets",
        "nbclient",
        "nbformat",
        "matplotlib",
    ]:
        assert needed in names
    pytest_cfg = pyproject()["tool"]["pytest"]["ini_options"]
    assert pytest_cfg["testpaths"] == ["tests"]  # tests/test_notebooks.py runs the notebooks
    assert "-ra" in pytest_cfg["addopts"]
    assert {m.split(":")[0] for m in pytest_cfg["markers"]} >= {"slow", "browser"}


def test_test_tools_are_an_extra_not_course_dependencies():
    """What only the tests and the repository's tools use is the `test` extra; the course itself
    (`pip install -e .`) does not pull it."""
    project = pyproject()["project"]
    runtime = set(by_name(project["dependencies"]))
    extra = by_name(project["optional-dependencies"]["test"])
    tools = {"pytest", "pytest-xdist", "playwright", "nbval", "ruff", "pre-commit"}
    assert tools <= extra.keys()
    assert not tools & runtime, f"test tools among the course's dependencies: {tools & runtime}"
    assert str(extra["ruff"]).startswith("=="), (
        "ruff is pinned exactly (its output changes by version)"
    )
    setup = (REPO_ROOT / "launch" / "setup.sh").read_text()
    assert 'install -e "$ROOT[test]"' in setup, (
        "launch/setup.sh installs the course with its test extra"
    )


def test_environment_matches_pyproject():
    env = environment()
    assert env["name"] == "fsdp-course"
    conda = [d for d in env["dependencies"] if isinstance(d, str)]
    assert "pip" in conda
    python = [d for d in conda if re.match(r"python\b", d)]
    assert python == ["python=3.11"]

    pip_list = conda_pip_list()
    editable = [line for line in pip_list if line.startswith("-e")]
    assert editable == ["-e ."], "environment.yml installs the course itself with '-e .'"
    in_conda = by_name([line for line in pip_list if not line.startswith("-")])
    project = pyproject()["project"]
    in_pyproject = by_name(project["dependencies"] + project["optional-dependencies"]["test"])
    assert in_conda.keys() == in_pyproject.keys(), (
        f"only in environment.yml: {sorted(in_conda.keys() - in_pyproject.keys())}; "
        f"only in pyproject.toml: {sorted(in_pyproject.keys() - in_conda.keys())}"
    )
    for name, spec in in_pyproject.items():
        assert in_conda[name] == spec, (
            f"{name}: pyproject '{spec}' vs environment.yml '{in_conda[name]}'"
        )


def test_python_version_of_the_environment_is_allowed():
    """The Python that environment.yml pins, and the one running these tests, are both ones
    pyproject.toml's requires-python accepts."""
    allowed = SpecifierSet(pyproject()["project"]["requires-python"])
    pins = [
        d for d in environment()["dependencies"] if isinstance(d, str) and re.match(r"python\b", d)
    ]
    assert len(pins) == 1, f"environment.yml should pin python once: {pins}"
    pinned = re.fullmatch(r"python\s*==?\s*(\d+\.\d+)(\.\*)?", pins[0])
    assert pinned, f"environment.yml: expected python=X.Y, got {pins[0]!r}"
    assert allowed.contains(pinned.group(1)), (
        f"environment.yml pins python {pinned.group(1)}, pyproject.toml requires {allowed}"
    )
    running = "{}.{}.{}".format(*sys.version_info[:3])
    assert allowed.contains(running), f"the tests run on Python {running}, outside {allowed}"


def lesson_notebooks() -> list[Path]:
    return sorted(
        p for p in (REPO_ROOT / "lessons").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts
    )


def test_notebooks_are_stored_without_outputs():
    notebooks = lesson_notebooks()
    if not notebooks:
        pytest.skip("no notebooks under lessons/ yet")
    dirty = []
    for path in notebooks:
        nb = json.loads(path.read_text())
        for i, cell in enumerate(nb.get("cells", [])):
            if cell.get("cell_type") != "code":
                continue
            if cell.get("outputs") or cell.get("execution_count") is not None:
                dirty.append(f"{path.relative_to(REPO_ROOT)} cell {i}")
    assert not dirty, (
        "notebooks must be stored without outputs and execution counts (clear them: "
        "jupyter nbconvert --clear-output --inplace NOTEBOOK): " + ", ".join(dirty)
    )
