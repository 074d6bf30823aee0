"""Lessons 6 to 9 in a real browser, as a learner meets them: Run All ends without an error output,
a prediction box keeps its measurement (and the table that holds it) hidden until a guess is
locked in, and a launch cell shows its progress while the ranks run.

JupyterLab as ``python -m course_lab.screenshots`` starts it (lab.sh serving a copy of the
notebooks, every cell rendered so a whole notebook can be read), in headless Debian Chromium driven
by Playwright (tests/test_browser.py's ``browser`` fixture: skipped, saying why, without them).
The lessons' launches are the test run's shared ones (COURSE_RUN_CACHE), so a lesson whose
notebook test ran first costs only its own cells here.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import nbformat
import pytest

from course_lab.screenshots import (
    ERROR_MARK,
    jupyterlab,
    open_notebook,
    run_all_and_wait,
    wait_idle,
)
from test_browser import WIDGET_FAILURES, browser  # noqa: F401  (a fixture)

LESSONS = {
    6: "lessons/06_silent_bugs/06_silent_bugs.ipynb",
    7: "lessons/07_memory/07_memory.ipynb",
    8: "lessons/08_troubleshooting/08_troubleshooting.ipynb",
    9: "lessons/09_your_model/09_your_model.ipynb",
}
PROGRESS_NB = "lessons/00_torchrun_ddp/launch_progress_check.ipynb"


@pytest.fixture(scope="module")
def server(browser, tmp_path_factory):  # noqa: F811 - the imported fixture
    """lab.sh serving a copy of the notebooks, every cell rendered (course_lab.screenshots)."""
    tmp = tmp_path_factory.mktemp("lessons-lab")
    with jupyterlab(tmp) as (base, token):
        yield SimpleNamespace(base=base, token=token, root=tmp / "course", tmp=tmp)


@pytest.fixture(scope="module")
def ran(browser, server):  # noqa: F811
    """Each of lessons 6-9 opened in its own page and run with Run -> Run All Cells once."""
    results = {}

    def run(lesson: int):
        if lesson not in results:
            page = open_notebook(browser, server.base, server.token, LESSONS[lesson])
            page.console_lines = []
            page.on("console", lambda m: page.console_lines.append(f"{m.type}: {m.text}"))
            results[lesson] = (page, run_all_and_wait(page))
            page.screenshot(path=str(server.tmp / f"lesson{lesson}.png"))
        return results[lesson]

    yield run
    for page, _ in results.values():
        page.close()


@pytest.mark.slow
@pytest.mark.parametrize("lesson", sorted(LESSONS))
def test_run_all_ends_without_an_error_output(ran, lesson):
    page, result = ran(lesson)
    text = page.locator(".jp-NotebookPanel:visible").first.inner_text()
    assert result["errors"] == 0 and ERROR_MARK not in text, (
        f"lesson {lesson}: Run All left an error output:\n"
        + text[max(0, text.find(ERROR_MARK) - 1500) : text.find(ERROR_MARK) + 1500]
    )
    assert result["not run"] == 0, f"lesson {lesson}: {result['not run']} code cells did not run"
    shown = [bad for bad in WIDGET_FAILURES if bad in text]
    assert not shown, f"lesson {lesson} shows {shown} instead of a widget"
    broken = [
        line
        for line in page.console_lines
        if re.search(r"Failed to load model class|Could not create a view", line)
    ]
    assert not broken, "widget errors in the browser console:\n" + "\n".join(broken)


@pytest.mark.slow
def test_a_prediction_stays_hidden_after_run_all_until_a_guess(ran):
    from playwright.sync_api import expect

    page, _ = ran(6)
    reveal = page.locator(".course-reveal").first
    expect(reveal).to_contain_text("hidden until you lock in a guess")
    assert not re.search(r"\d", reveal.inner_text().split(":", 1)[1]), reveal.inner_text()
    box = page.locator(".course-prediction").first
    box.scroll_into_view_if_needed()
    box.locator("input[type=text]").fill("0.5")
    box.locator("button", has_text="Lock in and reveal").click()
    expect(reveal).to_contain_text("you predicted 0.5")
    expect(reveal).to_contain_text("gap")
    expect(box).to_contain_text("you predicted 0.5")  # the guess cell shows it too
    expect(box.locator("input[type=text]")).to_be_disabled()


@pytest.mark.slow
def test_a_yes_no_prediction_hides_its_table_until_locked_in(ran):
    """Lesson 9's "are the fp32 logits equal?": after Run All the table that answers it is hidden;
    choosing an answer and locking it in shows the table and the comparison."""
    from playwright.sync_api import expect

    page, _ = ran(9)
    answer = page.locator("th", has_text="from_pretrained dtype")
    expect(answer).to_have_count(1)
    expect(answer).to_be_hidden()
    box = page.locator(".course-prediction", has_text="logits equal")
    box.scroll_into_view_if_needed()
    box.locator("button", has_text="False").click()
    box.locator("button", has_text="Lock in and reveal").click()
    expect(box).to_contain_text("you predicted False")
    expect(answer).to_be_visible()
    reveal = page.locator(".course-reveal", has_text="fp32 logits equal")
    expect(reveal).to_contain_text(re.compile(r"you predicted False; .*: (right|not this time)"))


@pytest.mark.slow
def test_a_launch_cell_shows_progress_while_it_runs(browser, server):  # noqa: F811
    """A launch with its own flags (so no other test's run is reused): rank 0 prints a metric line
    every step, and the cell shows the ranks up and a step bar before the folded log."""
    from playwright.sync_api import expect

    launch = (
        "from course_lab.notebook import run_lesson\n"
        'm = run_lesson(0, "--steps", "40", "--log-every", "1", "--seed", "24", nproc=2)'
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(launch)])
    nb.metadata = {
        "kernelspec": {
            "name": "python3",
            "display_name": "Python 3 (ipykernel)",
            "language": "python",
        }
    }
    nbformat.write(nb, server.root / PROGRESS_NB)
    page = open_notebook(browser, server.base, server.token, PROGRESS_NB)
    page.locator(".jp-Cell").first.locator(".jp-InputPrompt").first.click()
    page.keyboard.press("Shift+Enter")
    progress = page.locator(".course-launch-progress")
    expect(progress).to_contain_text("launch/lesson0.sh", timeout=30_000)
    expect(progress).to_contain_text("2 ranks up", timeout=90_000)
    expect(progress.locator("progress")).to_have_count(1, timeout=90_000)
    expect(progress).to_contain_text(re.compile(r"step \d+ of 40"))
    page.screenshot(path=str(server.tmp / "launch_progress.png"))
    fold = page.locator(".course-launch-log")
    expect(fold).to_have_count(1, timeout=120_000)
    expect(progress).to_have_count(0)  # the fold replaced the progress
    summary = fold.locator("summary").inner_text()
    assert "exit 0" in summary and "\n" not in summary.strip(), summary
    wait_idle(page, 30_000)
    page.close()
