"""The course home page (lessons/home.ipynb): the lessons found on disk, the learner's quiz
progress, and how to launch each lesson's multi-process part.

    from course_lab import home
    home.show()          # an HTML table in JupyterLab, plain text elsewhere

Lessons are discovered from ``lessons/NN_topic/`` folders, so a new lesson appears by itself.
Progress comes from the quizzes package's progress file (``$FSDP_COURSE_PROGRESS``, else
``~/.fsdp_course/progress.json``); nothing here writes to it.
"""
from __future__ import annotations

import html
import json
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LESSONS = REPO / "lessons"


@dataclass
class Lesson:
    number: int
    folder: Path
    notebook: Path | None      # None while the lesson's notebook is not written yet
    title: str

    @property
    def quiz(self) -> str:
        return f"lesson{self.number}"

    @property
    def launch(self) -> str:
        return f"bash launch/lesson{self.number}.sh"

    @property
    def link(self) -> str | None:
        """The notebook's path relative to lessons/ (where home.ipynb lives)."""
        return self.notebook.relative_to(LESSONS).as_posix() if self.notebook else None


def _title(notebook: Path | None, folder: Path) -> str:
    """The first Markdown heading of the notebook, else the folder's topic."""
    if notebook is not None:
        try:
            cells = json.loads(notebook.read_text(encoding="utf-8")).get("cells", [])
        except (OSError, ValueError):
            cells = []
        for cell in cells:
            if cell.get("cell_type") == "markdown":
                source = "".join(cell.get("source", ""))
                m = re.search(r"^#\s+(.+)$", source, re.M)
                if m:
                    return m.group(1).strip()
    return folder.name.split("_", 1)[-1].replace("_", " ")


def lessons(root: Path = LESSONS) -> list[Lesson]:
    """Every ``NN_topic`` folder under lessons/, in order."""
    found = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and re.match(r"\d\d_", p.name)):
        preferred = folder / f"{folder.name}.ipynb"
        others = sorted(folder.glob("*.ipynb"))
        notebook = preferred if preferred.is_file() else (others[0] if others else None)
        found.append(Lesson(int(folder.name[:2]), folder, notebook, _title(notebook, folder)))
    return found


def quiz_progress(lesson: str) -> dict | None:
    """{answered, correct, total} over the lesson's graded quiz questions; None if no quiz."""
    from quizzes import progress
    from quizzes.bank import QuizError, known_lessons, load_bank

    if lesson not in known_lessons():
        return None
    try:
        bank = load_bank(lesson)
    except QuizError:
        return None
    qids = [q.id for q in bank.questions if q.type != "code"]
    return progress.lesson_summary(lesson, qids)


def rows() -> list[dict]:
    out = []
    for les in lessons():
        p = quiz_progress(les.quiz)
        out.append({
            "lesson": les.number, "title": les.title, "notebook": les.link, "launch": les.launch,
            "quiz": None if p is None else f"{p['correct']} / {p['total']} correct"
                                            f" ({p['answered']} answered)",
        })
    return out


def text() -> str:
    """The same overview as plain text (terminals, logs)."""
    lines = []
    for r in rows():
        nb = f"lessons/{r['notebook']}" if r["notebook"] else "(notebook being written)"
        quiz = r["quiz"] or "no quiz yet"
        lines.append(f"{r['lesson']}  {r['title']}\n   notebook: {nb}\n"
                     f"   run:      {r['launch']}\n   quiz:     {quiz}")
    return "\n".join(lines)


def _html() -> str:
    e = html.escape
    body = []
    for r in rows():
        if r["notebook"]:
            # Relative to lessons/home.ipynb: JupyterLab opens the notebook in a new tab.
            nb = f'<a href="{e(r["notebook"])}">{e(r["title"])}</a>'
        else:
            nb = f"{e(r['title'])} <i>(notebook being written)</i>"
        quiz = e(r["quiz"]) if r["quiz"] else "<i>no quiz yet</i>"
        body.append(f"<tr><td>{r['lesson']}</td><td style='text-align:left'>{nb}</td>"
                    f"<td style='text-align:left'><code>{e(r['launch'])}</code></td>"
                    f"<td style='text-align:left'>{quiz}</td></tr>")
    head = ("<tr><th>#</th><th style='text-align:left'>lesson</th>"
            "<th style='text-align:left'>multi-process part (terminal, from the repo root)</th>"
            "<th style='text-align:left'>your quiz progress</th></tr>")
    return f"<table class='course-home'>{head}{''.join(body)}</table>"


def show() -> None:
    """Display the overview: an HTML table in a notebook, text elsewhere."""
    from quizzes import progress

    try:
        from IPython import get_ipython
        from IPython.display import HTML, display
    except ImportError:
        get_ipython = None
    where = progress.progress_path()
    lang = progress.get_setting("lang", "en")
    note = f"Progress file: {where} (quiz language: {lang})"
    if get_ipython is None or get_ipython() is None:
        print(text())
        print(note)
        return
    display(HTML(_html() + f"<p><small>{html.escape(note)}</small></p>"))
