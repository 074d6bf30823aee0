"""The course home page (lessons/home.ipynb): the lessons found on disk, the learner's quiz
progress, and how to launch each lesson's multi-process part.

    from course_lab import home
    home.show()          # one table in JupyterLab (with a Refresh button), plain text elsewhere

Lessons are discovered from ``lessons/NN_topic/`` folders, so a new lesson appears by itself.
Progress comes from the quizzes package's progress file (``$FSDP_COURSE_PROGRESS``, else
``~/.fsdp_course/progress.json``); nothing here writes to it.
"""

from __future__ import annotations

import html
import json
import re
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LESSONS = REPO / "lessons"


@dataclass
class Lesson:
    number: int
    folder: Path
    notebook: Path | None  # None while the lesson's notebook is not written yet
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
        return self.notebook.relative_to(self.folder.parent).as_posix() if self.notebook else None


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
    """{answered, correct, self_assessed, total} over the lesson's graded quiz questions (correct:
    graded correct by the quiz; self_assessed: marked right by the learner where the grader was
    unsure); None if the lesson has no quiz."""
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


def short_title(les: Lesson) -> str:
    """The notebook's title without its "Lesson N —" prefix (the table numbers the lessons)."""
    return re.sub(rf"^Lesson\s+{les.number}\s*[—:–-]\s*", "", les.title)


def progress_text(p: dict | None) -> str | None:
    if p is None:
        return None
    text = f"{p['correct']} / {p['total']} correct"
    if p.get("self_assessed"):
        text += f", {p['self_assessed']} self-assessed right"
    return text + f" ({p['answered']} answered)"


def rows(root: Path = LESSONS) -> list[dict]:
    out = []
    for les in lessons(root):
        p = quiz_progress(les.quiz)
        out.append(
            {
                "lesson": les.number,
                "title": short_title(les),
                "notebook": les.link,
                "launch": les.launch,
                "quiz": progress_text(p),
                "progress": p,
            }
        )
    return out


def _plain(title: str) -> str:
    return title.replace("`", "")


def _title_html(title: str) -> str:
    """`code` in a title as code, not as literal backticks."""
    parts = title.split("`")
    return "".join(
        f"<code>{html.escape(t)}</code>" if i % 2 else html.escape(t) for i, t in enumerate(parts)
    )


def text() -> str:
    """The same overview as plain text (terminals, logs)."""
    lines = []
    for r in rows():
        nb = f"lessons/{r['notebook']}" if r["notebook"] else "(notebook being written)"
        quiz = r["quiz"] or "no quiz yet"
        lines.append(
            f"{r['lesson']}  {_plain(r['title'])}\n   notebook: {nb}\n"
            f"   run:      {r['launch']}\n   quiz:     {quiz}"
        )
    return "\n".join(lines)


def table_html(root: Path = LESSONS) -> str:
    """One table: each lesson (a link to its notebook), its terminal command, your quiz progress."""
    e = html.escape
    body = []
    for r in rows(root):
        if r["notebook"]:
            # Relative to lessons/home.ipynb: JupyterLab opens the notebook in a new tab.
            nb = f'<a href="{e(r["notebook"])}">{_title_html(r["title"])}</a>'
        else:
            nb = f"{_title_html(r['title'])} <i>(notebook being written)</i>"
        quiz = e(r["quiz"]) if r["quiz"] else "<i>no quiz yet</i>"
        body.append(
            f"<tr><td>{r['lesson']}</td><td style='text-align:left'>{nb}</td>"
            f"<td style='text-align:left'><code>{e(r['launch'])}</code></td>"
            "<td style='text-align:left;white-space:nowrap' class='course-home-quiz'>"
            f"{quiz}</td></tr>"
        )
    head = (
        "<tr><th>#</th><th style='text-align:left'>lesson notebook</th>"
        "<th style='text-align:left'>run it in a terminal (from the course folder)</th>"
        "<th style='text-align:left'>your quiz progress</th></tr>"
    )
    return f"<table class='course-home'>{head}{''.join(body)}</table>"


def _note() -> str:
    from quizzes import progress

    return (
        f"Progress file: {progress.progress_path()} "
        f"(quiz language: {progress.get_setting('lang', 'en')}). "
        '"correct": graded correct by the quiz; "self-assessed": open answers the grader could '
        "not read whole, marked right by you against the key ideas."
    )


WATCH_S = 2.0  # how often the shown table looks at the progress file (a stat, nothing more)


class Home:
    """The table in an Output widget (JupyterLab renders its HTML, links included, as a cell's
    own output) under a Refresh button. Progress is read when shown, when Refresh is clicked,
    and, with watch=True, whenever the progress file changes (a quiz in another notebook or a
    terminal recorded an answer): a background thread looks every WATCH_S seconds."""

    def __init__(self, watch: bool = False):
        import ipywidgets as widgets

        self.watching = watch
        self.stamp = widgets.HTML()
        self.stamp.add_class("course-home-stamp")
        self.button = widgets.Button(
            description="Refresh progress", icon="refresh", layout={"width": "auto"}
        )
        self.button.add_class("course-home-refresh")
        self.button.on_click(lambda _b: self.refresh())
        self.table = widgets.Output()
        self.table.add_class("course-home-table")
        self.root = widgets.VBox(
            [widgets.HBox([self.button, self.stamp], layout={"align_items": "center"}), self.table]
        )
        self.refreshed = 0
        self._seen = None
        self._stop = threading.Event()
        self.refresh()
        if watch:
            threading.Thread(target=self._watch, name="course-home-progress", daemon=True).start()

    @staticmethod
    def _file_state():
        from quizzes import progress

        try:
            st = progress.progress_path().stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def refresh(self) -> None:
        self._seen = self._file_state()
        now = datetime.now().strftime("%H:%M:%S")
        how = (
            "it updates by itself after a quiz"
            if self.watching
            else "a snapshot: click Refresh after a quiz"
        )
        self.stamp.value = (
            f"<span style='margin-left:8px'>Your progress as of {now} ({how}).</span>"
        )
        page = table_html() + f"<p><small>{html.escape(_note())}</small></p>"
        self.table.outputs = (
            {
                "output_type": "display_data",
                "metadata": {},
                "data": {"text/html": page, "text/plain": text()},
            },
        )
        self.refreshed += 1  # last: a reader that sees the count sees the table it counts

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_S):
            if self._file_state() != self._seen:
                try:
                    self.refresh()
                except (
                    Exception
                ):  # the kernel is going away: stop quietly, never a traceback in a cell
                    return

    def stop(self) -> None:
        """Stop watching the progress file."""
        self._stop.set()


_shown: Home | None = None


def show() -> None:
    """Display the overview: the table (updating itself as progress changes, and with a Refresh
    button) in a notebook, text elsewhere."""
    global _shown
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        get_ipython = None
    if get_ipython is None or get_ipython() is None:
        print(text())
        print(_note())
        return
    if _shown is not None:  # the cell run again: one table watches the file, not one per run
        _shown.stop()
    _shown = Home(watch=True)
    display(_shown.root)
