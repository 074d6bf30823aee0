"""The course home notebook (lessons/home.ipynb): it executes cleanly, links every lesson notebook
with a relative link, shows the learner's quiz progress and each lesson's launcher."""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from helpers import REPO_ROOT

HOME = REPO_ROOT / "lessons" / "home.ipynb"


def lesson_notebooks() -> list[Path]:
    return sorted(p for p in (REPO_ROOT / "lessons").glob("*/*.ipynb")
                  if ".ipynb_checkpoints" not in p.parts)


def markdown_links(nb) -> list[str]:
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    return re.findall(r"\]\(([^)\s]+\.ipynb)\)", text)


def test_home_links_every_lesson_notebook():
    nb = nbformat.read(HOME, as_version=4)
    links = markdown_links(nb)
    assert links, "the home notebook links no lesson"
    for link in links:
        assert not link.startswith(("/", "http")), f"{link}: links must be relative to lessons/"
        target = HOME.parent / link
        # A lesson being written has its folder (train.py) before its notebook.
        assert target.parent.is_dir(), f"home.ipynb links {link}, but {target.parent} does not exist"
    linked = {(HOME.parent / link).resolve() for link in links}
    missing = [str(p.relative_to(REPO_ROOT)) for p in lesson_notebooks() if p.resolve() not in linked]
    assert not missing, f"lesson notebooks not linked from lessons/home.ipynb: {missing}"
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    for folder in sorted((REPO_ROOT / "lessons").glob("[0-9][0-9]_*")):
        assert f"bash launch/lesson{int(folder.name[:2])}.sh" in text


@pytest.mark.slow
def test_home_notebook_executes_and_shows_progress(progress_file):
    import quizzes
    from quizzes import progress

    bank = quizzes.load_bank("lesson0")
    q = next(q for q in bank.questions if q.type == "single")
    progress.record("lesson0", progress.Mark(q.id, "correct", 1.0))
    progress.set_setting("lang", "zh")

    nb = nbformat.read(HOME, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(HOME.parent)}}).execute()
    html = "".join(out.get("data", {}).get("text/html", "")
                   for c in nb.cells if c.cell_type == "code" for out in c.outputs)
    errors = [out for c in nb.cells if c.cell_type == "code" for out in c.outputs
              if out.output_type == "error" or out.get("name") == "stderr"]
    assert not errors, errors
    graded = sum(1 for q in bank.questions if q.type != "code")
    assert f"1 / {graded} correct (1 answered)" in html
    assert "quiz language: zh" in html and str(progress_file) in html
    for nb_path in lesson_notebooks():
        assert f'href="{nb_path.relative_to(HOME.parent).as_posix()}"' in html
    assert "bash launch/lesson0.sh" in html and "bash launch/lesson1.sh" in html
