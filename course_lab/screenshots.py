"""Screenshots of every lesson as a learner sees it after Run All, for reviewers.

    python -m course_lab.screenshots OUTDIR                 # every lesson
    python -m course_lab.screenshots OUTDIR --lessons 6,7   # some

Starts JupyterLab with ``bash launch/lab.sh`` (loopback, a random token) on a temporary copy of the
notebooks, opens each lesson in headless Chromium (Debian's ``chromium``; the ``playwright``
package drives it, never a browser download), runs it top to bottom (Run -> Run All Cells) and
saves into OUTDIR: the first prediction box and its hidden measurement as Run All leaves them,
then (every prediction locked in with a guess) each figure (``lessonN-figure-K.png``), the quiz
(``lessonN-quiz.png``), the first launch log (folded) and a revealed line, and one line per
lesson in ``OUTDIR/summary.txt``: how long Run All took and whether any cell ended in an error.
The notebooks' launches run for real (30-60 s a lesson on 2 CPU cores).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from course_lab.notebook import REPO

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
ERROR_MARK = "Traceback (most recent call last)"


def chromium() -> str | None:
    """$COURSE_CHROMIUM when set (only it: a path asked for is never swapped for another), else
    Debian's chromium."""
    if os.environ.get("COURSE_CHROMIUM"):
        candidates = [os.environ["COURSE_CHROMIUM"]]
    else:
        candidates = [
            "/usr/bin/chromium",
            shutil.which("chromium"),
            shutil.which("chromium-browser"),
        ]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def lesson_notebooks(lessons=None) -> list[Path]:
    found = sorted(p for p in (REPO / "lessons").glob("[0-9][0-9]_*/[0-9][0-9]_*.ipynb"))
    return [p for p in found if lessons is None or int(p.name[:2]) in lessons]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _copy_notebook_link_the_rest(src, dst):
    if str(src).endswith(".ipynb"):
        return shutil.copy2(src, dst)
    os.symlink(os.path.abspath(src), dst)
    return dst


@contextmanager
def jupyterlab(folder: Path, env_extra: dict | None = None):
    """``bash launch/lab.sh`` serving a copy of lessons/ under ``folder``; yields (base, token)."""
    root, settings = folder / "course", folder / "settings"
    # The notebooks copied (JupyterLab saves them); every other file a link to the repository's,
    # so a lesson module that finds its files through __file__ finds them where they are.
    shutil.copytree(
        REPO / "lessons",
        root / "lessons",
        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"),
        copy_function=_copy_notebook_link_the_rest,
    )
    for entry in ("launch", "docs", "solutions", "quizzes"):  # what a notebook reads by path
        if (REPO / entry).exists():
            (root / entry).symlink_to(REPO / entry)
    notes = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notes.parent.mkdir(parents=True)
    notes.write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True})
    )
    # Every cell in the page (JupyterLab 4 renders only the cells in view by default): the
    # figures and prompts of a whole notebook can then be found and photographed.
    tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True)
    tracker.write_text(json.dumps({"windowingMode": "none"}))
    token = secrets.token_hex(16)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LAB_IP", "LAB_OPEN_BROWSER", "JUPYTER_TOKEN", "JUPYTER_PASSWORD")
    }
    env.update(
        {
            "LAB_PORT": str(_free_port()),
            "LAB_TOKEN": token,
            "LAB_ROOT_DIR": str(root),
            "PYTHON": sys.executable,
            "FSDP_COURSE_PROGRESS": str(folder / "progress.json"),
            "JUPYTER_RUNTIME_DIR": str(folder / "runtime"),
            "JUPYTER_CONFIG_DIR": str(folder / "config"),
            **(env_extra or {}),
        }
    )
    log_path = folder / "lab.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [
                "bash",
                str(REPO / "launch" / "lab.sh"),
                f"--LabApp.user_settings_dir={settings}",
                f"--LabApp.workspaces_dir={folder / 'workspaces'}",
                "--ServerApp.port_retries=0",
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            base = None
            deadline = time.monotonic() + 120
            while base is None or not _ready(base, token):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("JupyterLab did not start:\n" + log_path.read_text()[-2000:])
                found = re.search(
                    r"http://127\.0\.0\.1:(\d+)/lab/tree/\S+\?token=" + token,
                    log_path.read_text(errors="replace"),
                )
                base = f"http://127.0.0.1:{found.group(1)}" if found else None
                time.sleep(0.3)
            yield base, token
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # the server shuts its kernels down
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _ready(base: str, token: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


def open_notebook(browser, base: str, token: str, relpath: str):
    # Tall: an element taller than the view (a quiz) is photographed whole.
    page = browser.new_page(viewport={"width": 1400, "height": 3000})
    page.set_default_timeout(30_000)
    page.goto(f"{base}/lab/tree/{relpath}?reset&token={token}")  # reset: not the last tabs
    page.locator(".jp-NotebookPanel:visible .jp-Notebook").first.wait_for()
    wait_idle(page, 120_000)
    return page


def wait_idle(page, timeout_ms: int) -> None:
    """The kernel idle (toolbar indicator and status bar) and no cell waiting to run ([*])."""
    page.wait_for_function(
        """() => {
            const panel = [...document.querySelectorAll('.jp-NotebookPanel')]
                .find(p => p.checkVisibility());
            const ind = panel && panel.querySelector('.jp-Notebook-ExecutionIndicator');
            const bar = document.querySelector('#jp-main-statusbar span[title^="Change kernel"]');
            if (!ind || !bar) return false;
            const text = bar.textContent.trim();
            const busy = [...panel.querySelectorAll('.jp-InputPrompt')]
                .some(p => p.textContent.includes('*'));
            return ind.getAttribute('data-status') === 'idle' && text.endsWith('| Idle')
                   && !text.startsWith('No Kernel') && !busy;
        }""",
        timeout=timeout_ms,
    )


def run_all(page) -> None:
    """Run -> Run All Cells on the notebook in view, focused first (a fresh page may have no
    current notebook for the menu's command); tried again if no cell was queued."""
    panel = page.locator(".jp-NotebookPanel:visible").first
    for _ in range(2):
        panel.locator(".jp-Cell .jp-InputPrompt").first.click()
        page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()
        try:  # the first cell queued: wait_idle must not see the notebook before Run All began
            panel.locator(".jp-InputPrompt", has_text=re.compile(r"\[(\*|\d+)\]")).first.wait_for(
                timeout=15_000
            )
            return
        except Exception:  # playwright's TimeoutError: nothing queued yet
            continue


def run_all_and_wait(page, timeout_ms: int = 600_000) -> dict:
    """Run All, wait until it ends; what it left: seconds, code cells not run, error outputs."""
    started = time.monotonic()
    run_all(page)
    wait_idle(page, timeout_ms)
    panel = page.locator(".jp-NotebookPanel:visible").first
    prompts = panel.locator(".jp-CodeCell .jp-InputPrompt").all_inner_texts()
    text = panel.locator(".jp-Notebook").first.inner_text()
    return {
        "seconds": round(time.monotonic() - started, 1),
        "code cells": len(prompts),
        "not run": sum(1 for p in prompts if not re.search(r"\[\d+\]", p)),
        "errors": text.count(ERROR_MARK),
    }


def lock_in_all(page) -> int:
    """Give every prediction a guess (1, or its first choice) and lock it in, as a learner going
    through the lesson would: the tables and figures that wait for a guess then show."""
    boxes = page.locator(".course-prediction").all()
    for box in boxes:
        button = box.locator("button", has_text="Lock in and reveal")
        if button.is_disabled():
            continue
        box.scroll_into_view_if_needed()
        typed = box.locator("input[type=text]")
        if typed.count():
            typed.first.fill("1")
        else:
            box.locator(".widget-toggle-button").first.click()
        button.click()
    page.wait_for_timeout(500)  # the kernel's replies redraw the revealed outputs
    return len(boxes)


def shoot(page, outdir: Path, stem: str) -> list[Path]:
    """The first prediction box and its hidden measurement as Run All leaves them; then, with
    every prediction locked in, each figure, the quiz, the first launch log and a revealed line."""
    saved = []

    def save(name, element):
        element.scroll_into_view_if_needed()
        path = outdir / f"{name}.png"
        element.screenshot(path=str(path))
        saved.append(path)

    for name, selector in (("prediction", ".course-prediction"), ("hidden", ".course-reveal")):
        found = page.locator(selector).all()
        if found:
            save(f"{stem}-{name}", found[0])
    lock_in_all(page)
    figures = [el for el in page.locator(".jp-OutputArea-output img").all() if el.is_visible()]
    for i, element in enumerate(figures):
        save(f"{stem}-figure-{i + 1}", element)
    for name, selector in (
        ("quiz", ".quiz-root"),
        ("launch", ".course-launch-log"),
        ("reveal", ".course-reveal"),
    ):
        found = page.locator(selector).all()
        if found:
            save(f"{stem}-{name}", found[0])
    return saved


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m course_lab.screenshots",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("outdir", type=Path)
    parser.add_argument(
        "--lessons", default=None, help="comma-separated lesson numbers (default: all)"
    )
    args = parser.parse_args(argv)
    try:
        lessons = None if args.lessons is None else {int(x) for x in args.lessons.split(",")}
    except ValueError:
        parser.error(f"--lessons {args.lessons}: lesson numbers, e.g. 6,7")
    exe = chromium()
    if exe is None:
        print(
            "no Chromium: apt-get install chromium (or set COURSE_CHROMIUM=/path/to/chromium)",
            file=sys.stderr,
        )
        return 2
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print(
            "the playwright package is missing: pip install playwright "
            "(never `playwright install`: the system Chromium is used)",
            file=sys.stderr,
        )
        return 2
    notebooks = lesson_notebooks(lessons)
    if not notebooks:
        parser.error(f"--lessons {args.lessons}: no such lesson")
    args.outdir.mkdir(parents=True, exist_ok=True)
    summary = []
    with (
        tempfile.TemporaryDirectory(prefix="course-screens-") as tmp,
        jupyterlab(Path(tmp)) as (base, token),
        sync_playwright() as pw,
    ):
        browser = pw.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
        for nb in notebooks:
            relpath = nb.relative_to(REPO).as_posix()
            page = open_notebook(browser, base, token, relpath)
            result = run_all_and_wait(page)
            saved = shoot(page, args.outdir, f"lesson{int(nb.name[:2])}")
            line = (
                f"{relpath}: Run All {result['seconds']} s, {result['code cells']} code cells, "
                f"{result['not run']} not run, {result['errors']} error outputs, "
                f"{len(saved)} screenshots"
            )
            print(line, flush=True)
            summary.append(line)
            page.close()
        browser.close()
    (args.outdir / "summary.txt").write_text("\n".join(summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
