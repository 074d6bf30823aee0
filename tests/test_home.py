"""The course home notebook (lessons/home.ipynb): one lesson table, made from the lesson folders
(a new lesson appears by itself), linking every lesson notebook relative to lessons/, with each
lesson's launcher and the learner's quiz progress (machine-graded and self-assessed apart), a
Refresh button that reads progress again, and one title style."""

from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from helpers import REPO_ROOT

HOME = REPO_ROOT / "lessons" / "home.ipynb"


def lesson_notebooks() -> list[Path]:
    return sorted(
        p for p in (REPO_ROOT / "lessons").glob("*/*.ipynb") if ".ipynb_checkpoints" not in p.parts
    )


def test_home_has_one_lesson_table_made_from_the_folders():
    nb = nbformat.read(HOME, as_version=4)
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    # no second, hand-kept table of lessons beside the one the code cell shows
    assert not re.findall(r"\]\(([^)\s]+\.ipynb)\)", markdown)
    assert not re.search(r"^\|.*\|\s*$", markdown, re.M)
    code = [c.source for c in nb.cells if c.cell_type == "code"]
    assert any("home.show()" in c for c in code)

    from course_lab import home

    page = home.table_html()
    assert page.count("<table") == 1
    for nb_path in lesson_notebooks():
        assert f'href="{nb_path.relative_to(HOME.parent).as_posix()}"' in page
    for folder in sorted((REPO_ROOT / "lessons").glob("[0-9][0-9]_*")):
        assert f"bash launch/lesson{int(folder.name[:2])}.sh" in page
    assert "`" not in page and "`" not in home.text()


def test_a_new_lesson_folder_appears_in_the_table(tmp_path):
    from course_lab import home

    for name, title in [
        ("00_first", "# Lesson 0 — First"),
        ("09_new", "# Lesson 9 — The `new` thing"),
    ]:
        (tmp_path / name).mkdir()
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(title + "\n\nText.")])
        nbformat.write(nb, tmp_path / name / f"{name}.ipynb")
    (tmp_path / "10_later").mkdir()  # its notebook is not written yet
    rows = home.rows(tmp_path)
    assert [(r["lesson"], r["title"]) for r in rows] == [
        (0, "First"),
        (9, "The `new` thing"),
        (10, "later"),
    ]
    page = home.table_html(tmp_path)
    assert '<a href="09_new/09_new.ipynb">The <code>new</code> thing</a>' in page
    assert "bash launch/lesson9.sh" in page and "later <i>(notebook being written)</i>" in page


def test_every_lesson_title_has_one_style():
    for nb_path in lesson_notebooks():
        first = nbformat.read(nb_path, as_version=4).cells[0].source.splitlines()[0]
        number = int(nb_path.parent.name[:2])
        assert re.fullmatch(rf"# Lesson {number} — [^`]+", first), f"{nb_path.name}: {first!r}"
    title = nbformat.read(HOME, as_version=4).cells[0].source.splitlines()[0]
    assert re.fullmatch(r"# fsdp-course — \S.*", title), title


def test_progress_shows_self_assessed_apart_and_refresh_reads_it_again(progress_file):
    import quizzes
    from course_lab import home
    from quizzes import progress

    bank = quizzes.load_bank("lesson1")
    graded = len(bank.graded())
    view = home.Home()
    page = view.table.outputs[0]["data"]["text/html"]
    assert f"0 / {graded} correct (0 answered)" in page and "as of" in view.stamp.value
    progress.record(
        "lesson1",
        progress.Mark("q_zero_mapping", "correct", 1.0),
        progress.Mark("q_full_vs_shard_grad_op", "unsure", 0.5),
    )
    progress.record(
        "lesson1", progress.Mark("q_full_vs_shard_grad_op", "correct", graded_by="self")
    )
    assert view.table.outputs[0]["data"]["text/html"] == page  # a snapshot, as it says
    view.button.click()
    page = view.table.outputs[0]["data"]["text/html"]
    assert f"1 / {graded} correct, 1 self-assessed right (2 answered)" in page
    assert view.refreshed == 2 and str(progress_file) in page


def test_shown_table_updates_itself_when_progress_changes(progress_file, monkeypatch):
    import time

    import quizzes
    from course_lab import home
    from quizzes import progress

    monkeypatch.setattr(home, "WATCH_S", 0.05)
    view = home.Home(watch=True)
    try:
        assert "updates by itself" in view.stamp.value and view.refreshed == 1
        time.sleep(0.3)
        assert view.refreshed == 1  # nothing changed: nothing read again
        qid = quizzes.load_bank("lesson2").graded()[0].id
        progress.record("lesson2", progress.Mark(qid, "correct", 1.0))
        deadline = time.monotonic() + 10
        while view.refreshed == 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert view.refreshed == 2
        row = re.search(
            r"02_wrap_policies\.ipynb.*?</tr>", view.table.outputs[0]["data"]["text/html"]
        ).group(0)
        assert "(1 answered)" in row, row
    finally:
        view.stop()


@pytest.mark.slow
def test_home_notebook_executes_and_shows_progress(progress_file):
    import quizzes
    from quizzes import progress

    bank = quizzes.load_bank("lesson0")
    q = next(q for q in bank.questions if q.type == "single")
    progress.record("lesson0", progress.Mark(q.id, "correct", 1.0))
    progress.set_setting("lang", "zh")

    nb = nbformat.read(HOME, as_version=4)
    NotebookClient(
        nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(HOME.parent)}}
    ).execute()
    errors = [
        out
        for c in nb.cells
        if c.cell_type == "code"
        for out in c.outputs
        if out.output_type == "error" or out.get("name") == "stderr"
    ]
    assert not errors, errors
    views = [
        out
        for c in nb.cells
        if c.cell_type == "code"
        for out in c.outputs
        if "application/vnd.jupyter.widget-view+json" in out.get("data", {})
    ]
    assert len(views) == 1, "home.show() displays one widget (the table under its Refresh button)"
    # the Output widget's content, as the kernel left it (nbclient keeps the widgets' state)
    state = json.dumps(
        nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"], ensure_ascii=False
    )
    graded = sum(1 for q in bank.questions if q.type != "code")
    assert f"1 / {graded} correct (1 answered)" in state
    assert "quiz language: zh" in state and str(progress_file) in state
    for nb_path in lesson_notebooks():
        assert nb_path.relative_to(HOME.parent).as_posix() in state
