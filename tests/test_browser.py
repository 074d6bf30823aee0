"""The course in a real browser: JupyterLab started by ``bash launch/lab.sh``, driven by headless
Chromium through Playwright.

Widgets that render under nbclient but not in JupyterLab (ipywidgets and its lab extension out of
step, feedback printed to the log console instead of the cell) only show up here. The server runs
lab.sh's own command on a free loopback port with a known token, serving a temporary copy of the
notebooks (JupyterLab writes .ipynb_checkpoints) with the quiz progress file in that folder too.
One browser page, opened at lab.sh's default URL (the home page), serves the whole file: each
notebook opens in a tab of it, and each test brings its notebook's tab to the front.

Needs Debian's ``chromium`` (``apt-get install chromium``; .ci/run installs it when it can) and
the ``playwright`` Python package; never ``playwright install``: the system Chromium is used.
Without them the browser tests are skipped and say why (``pytest -ra``).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest

from course_lab.screenshots import CHROMIUM_ARGS, chromium
from helpers import REPO_ROOT

WAIT_MS = 30_000  # Playwright's default of 5 s is too short for kernels and widgets
DOCUMENT_TABS = ".lm-DockPanel-tabBar .lm-TabBar-tab"  # JupyterLab's tabs of open documents
CHECK_NB = "browser_check.ipynb"
LESSON0 = "lessons/00_torchrun_ddp/00_torchrun_ddp.ipynb"
# What JupyterLab shows instead of a widget when ipywidgets and its lab extension disagree
# (or no widget manager is there at all).
WIDGET_FAILURES = [
    "Error displaying widget",
    "Failed to load model class",
    "Loading widget...",
    "VBox(children=",
    "Error creating widget",
]


# --- Chromium and Playwright ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    exe = chromium()
    if exe is None:
        pytest.skip(
            f"no Chromium at {os.environ.get('COURSE_CHROMIUM') or '/usr/bin/chromium'}: "
            "install Debian's package (apt-get install chromium; .ci/run does where it "
            "can) or set COURSE_CHROMIUM=/path/to/chromium"
        )
    try:
        from playwright.sync_api import expect, sync_playwright
    except ImportError:
        pytest.skip(
            "the playwright Python package is missing (pip install playwright; "
            "bash launch/setup.sh installs it). Do not run `playwright install`"
        )
    expect.set_options(timeout=WAIT_MS)
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


# --- JupyterLab through launch/lab.sh ------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, headers: dict | None = None) -> tuple[int, str, str]:
    """(status, final url, body) of a GET, without raising on 4xx/5xx."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.url, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, url, e.read().decode("utf-8", "replace")


def check_notebook() -> nbformat.NotebookNode:
    """A small notebook with the course's real quiz widget and a plot drawn with course code
    (a whole lesson takes 30-60 s to run)."""
    quiz = 'import quizzes\n\nquiz = quizzes.show("lesson0")'
    plot = """\
import matplotlib.pyplot as plt
from fsdp_course import theory

units = [200_000] + [150_000] * 4          # a root unit and four transformer blocks
ranks = [1, 2, 4, 8]
fig, ax = plt.subplots(figsize=(5, 3))
for strategy in theory.STRATEGIES[:3]:
    per_rank = [sum(theory.model_state_bytes(units, n, strategy).values()) / 2**20 for n in ranks]
    ax.plot(ranks, per_rank, "o-", label=strategy)
ax.set_xlabel("ranks"); ax.set_ylabel("model state MiB / rank"); ax.legend()
plt.tight_layout(); plt.show()"""
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell(quiz),
            nbformat.v4.new_code_cell(plot),
            nbformat.v4.new_code_cell(UNSURE_CELL),
        ]
    )
    for cell, cid in zip(nb.cells, ["quiz", "plot", "unsure"]):
        cell.id = cid
    nb.metadata = {
        "kernelspec": {
            "name": "python3",
            "display_name": "Python 3 (ipykernel)",
            "language": "python",
        }
    }
    return nb


# An "unsure" open result as grading's contract shapes it (found / missing / unread / false /
# checklist / reference), for lesson 1's open question: what the learner sees, and the
# self-assessment they click, do not depend on which answers today's grader is unsure of.
UNSURE_LABELS = {
    "en": [
        "FULL_SHARD frees the gathered parameters after forward",
        "SHARD_GRAD_OP keeps them until backward",
        "SHARD_GRAD_OP uses more memory, FULL_SHARD less",
    ],
    "zh": [
        "FULL_SHARD 在前向之后释放收集来的参数",
        "SHARD_GRAD_OP 保留参数直到反向",
        "SHARD_GRAD_OP 显存更多，FULL_SHARD 更少",
    ],
}
UNSURE_CELL = f"""\
import quizzes
from quizzes import widget
from quizzes.grading import Result

LABELS = {UNSURE_LABELS!r}
_grade = widget.grade_question


def unsure(q, answer, lang="en"):
    if q.type != "open" or "gather thing" not in answer:
        return _grade(q, answer, lang)
    return Result(False, 0.5, "", {{
        "found": ["free"], "missing": ["keep", "memory"], "found_labels": LABELS[lang][:1],
        "missing_labels": LABELS[lang][1:], "unread": [answer.split(". ")[-1]],
        "false": [{{"quote": "FULL_SHARD keeps them",
                    "fix": {{"en": "it frees them after forward",
                            "zh": "它在前向之后释放参数"}}[lang]}}],
        "checklist": LABELS[lang], "reference": q.secret["reference"][lang], "too_short": False}},
        verdict="unsure")


widget.grade_question = unsure
unsure_quiz = quizzes.show("lesson1", lang="en")"""


def serve_copy(dest: Path) -> None:
    """The repository's notebooks (not .ipynb_checkpoints) under dest, plus the check notebook."""
    for nb in (REPO_ROOT / "lessons").rglob("*.ipynb"):
        if ".ipynb_checkpoints" in nb.parts:
            continue
        target = dest / nb.relative_to(REPO_ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(nb, target)
    nbformat.write(check_notebook(), dest / CHECK_NB)


def write_settings(settings: Path) -> None:
    # The "get notified about official Jupyter news?" pop-up would cover part of the page.
    notes = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    notes.parent.mkdir(parents=True, exist_ok=True)
    notes.write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False, "doNotDisturbMode": True})
    )


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM (the server shuts its kernels down), wait, then kill."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab as `bash launch/lab.sh` starts it, on a free loopback port with a token."""
    tmp = tmp_path_factory.mktemp("lab")
    root, settings = tmp / "course", tmp / "settings"
    serve_copy(root)
    write_settings(settings)
    token = secrets.token_hex(16)
    progress = tmp / "progress.json"
    env = dict(os.environ)
    for var in ("LAB_IP", "LAB_OPEN_BROWSER", "LAB_DRY_RUN", "JUPYTER_TOKEN", "JUPYTER_PASSWORD"):
        env.pop(var, None)
    env.update(
        {
            "LAB_PORT": str(free_port()),
            "LAB_TOKEN": token,
            "LAB_ROOT_DIR": str(root),
            "PYTHON": sys.executable,  # the test's interpreter; lab.sh skips setup.sh
            "FSDP_COURSE_PROGRESS": str(progress),
            "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
            "JUPYTER_CONFIG_DIR": str(tmp / "config"),  # no personal jupyter config (passwords ...)
        }
    )
    log_path = tmp / "lab.log"
    log = open(log_path, "w")
    cmd = [
        "bash",
        str(REPO_ROOT / "launch" / "lab.sh"),
        f"--LabApp.user_settings_dir={settings}",
        f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
        "--ServerApp.port_retries=0",
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )

    def log_tail() -> str:
        return "".join(log_path.read_text(errors="replace").splitlines(keepends=True)[-30:])

    try:
        base = None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"launch/lab.sh exited with {proc.returncode}:\n{log_tail()}")
            if base is None:
                # lab.sh prints the URL to open, token included: the port is read from it.
                m = re.search(
                    r"http://127\.0\.0\.1:(\d+)/lab/tree/(\S+)\?token=" + token,
                    log_path.read_text(errors="replace"),
                )
                if m:
                    base, home = f"http://127.0.0.1:{m.group(1)}", m.group(2)
            if base is not None:
                try:
                    if http(f"{base}/api/status?token={token}")[0] == 200:
                        break
                except OSError:
                    pass
            time.sleep(0.3)
        else:
            pytest.fail(f"JupyterLab from launch/lab.sh not ready in 90 s:\n{log_tail()}")
        yield SimpleNamespace(
            base=base,
            token=token,
            root=root,
            progress=progress,
            home=home,
            proc=proc,
            log=log_path,
            tmp=tmp,
            log_tail=log_tail,
        )
    finally:
        stop(proc)
        log.close()


def read_progress(lab) -> dict:
    try:
        return json.loads(lab.progress.read_text())
    except (FileNotFoundError, ValueError):
        return {}


def wait_for(predicate, timeout=15.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# --- Server safety (no browser needed) -----------------------------------------------------------


def test_lab_sh_serves_loopback_only_with_a_token(lab):
    status, _, _ = http(f"{lab.base}/api/contents")
    assert status == 403, f"unauthenticated GET /api/contents answered {status}, not 403"
    assert http(f"{lab.base}/api/contents?token=wrong{lab.token}")[0] == 403
    assert http(f"{lab.base}/api/contents?token={lab.token}")[0] == 200
    assert http(f"{lab.base}/api/contents", {"Authorization": f"token {lab.token}"})[0] == 200

    # Loopback only: the same port on this machine's other addresses refuses connections.
    port = int(lab.base.rsplit(":", 1)[1])
    others = set()
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent; picks the outgoing interface
            others.add(s.getsockname()[0])
    except OSError:
        pass
    others = {a for a in others if not a.startswith("127.")}
    for addr in others:
        with socket.socket() as s:
            s.settimeout(2)
            assert s.connect_ex((addr, port)) != 0, f"JupyterLab answers on {addr}:{port}"

    # lab.sh opens the course home page by default.
    assert lab.home == "lessons/home.ipynb"
    status, final, _ = http(f"{lab.base}/?token={lab.token}")
    assert status == 200 and "/lab/tree/lessons/home.ipynb" in final, final


# --- Browser helpers -----------------------------------------------------------------------------


def new_page(browser, lab):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(WAIT_MS)
    page.console_lines = []
    page.on("console", lambda m: page.console_lines.append(f"{m.type}: {m.text}"))
    return page


@pytest.fixture(scope="module")
def lab_page(browser, lab):
    """One JupyterLab page for the whole file, opened at lab.sh's default URL as a learner's
    browser opens it. Loading JupyterLab costs Chromium more CPU than anything else here, so each
    notebook opens in a tab of this page, and a test brings its notebook to the front first."""
    from playwright.sync_api import expect

    page = new_page(browser, lab)
    page.goto(f"{lab.base}/?token={lab.token}")
    landed_url = page.url  # before JupyterLab's router changes it
    expect(
        page.locator(".jp-MainAreaWidget:visible"),
        "JupyterLab at lab.sh's default URL shows no document",
    ).to_have_count(1)
    yield SimpleNamespace(page=page, landed_url=landed_url)
    page.screenshot(path=str(lab.tmp / "lab_page.png"), full_page=True)
    page.close()


class NotebookTab:
    """A notebook's tab in the shared page and its panel, found by the tab's widget id (not by
    visibility: the other notebooks' panels are in the page too, hidden)."""

    def __init__(self, page, name: str):
        from playwright.sync_api import expect

        self.page = page
        self.tab = page.locator(DOCUMENT_TABS, has_text=name)
        expect(self.tab, f"no tab for {name}").to_have_count(1)
        self.panel = page.locator(f"[id='{self.tab.get_attribute('data-id')}']")

    def show(self):
        from playwright.sync_api import expect

        self.tab.click()
        expect(self.panel).to_be_visible()
        return self


def open_from_path(page, path: str) -> NotebookTab:
    """File > Open from Path...: the notebook in a new tab of this page (no second page load)."""
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^File$")).click()
    page.locator(".lm-Menu-item[data-command='filebrowser:open-path']").click()
    dialog = page.locator(".jp-Dialog")
    dialog.locator("input").fill(path)
    dialog.locator("button.jp-mod-accept").click()
    return NotebookTab(page, Path(path).name)


def wait_kernel_idle(page, timeout_ms=90_000):
    # The toolbar indicator alone is unreliable while the kernel starts: check the status bar too.
    page.wait_for_function(
        """() => {
            const panel = [...document.querySelectorAll('.jp-NotebookPanel')]
                .find(p => p.checkVisibility());
            const ind = panel && panel.querySelector('.jp-Notebook-ExecutionIndicator');
            const bar = document.querySelector('#jp-main-statusbar span[title^="Change kernel"]');
            if (!ind || !bar) return false;
            const text = bar.textContent.trim();
            return ind.getAttribute('data-status') === 'idle' && text.endsWith('| Idle')
                   && !text.startsWith('No Kernel');
        }""",
        timeout=timeout_ms,
    )


def run_all(page):
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-item[data-command='runmenu:run-all']").click()


def run_cell(page, panel, index: int):
    """Select cell `index` (0-based, markdown cells included) and run it with Shift+Enter."""
    cell = panel.locator(".jp-Notebook .jp-Cell").nth(index)
    cell.scroll_into_view_if_needed()
    cell.locator(".jp-InputPrompt").first.click()
    page.keyboard.press("Shift+Enter")
    return cell


def wait_cell_done(cell, timeout_ms=120_000):
    """Until the cell's prompt shows an execution count ([3]:, not [*]: or [ ]:)."""
    cell.locator(".jp-InputPrompt").first.filter(has_text=re.compile(r"\[\d+\]")).wait_for(
        timeout=timeout_ms
    )


def assert_no_widget_failure(page, where):
    text = where.inner_text()
    for bad in WIDGET_FAILURES:
        assert bad not in text, f"the page shows {bad!r} instead of the quiz widget:\n{text[:2000]}"
    broken = [
        line
        for line in page.console_lines
        if re.search(
            r"Failed to load model class|Could not create a view|"
            r"Class .* not found in module",
            line,
        )
    ]
    assert not broken, "widget errors in the browser console:\n" + "\n".join(broken)


def lesson0_facts():
    import quizzes

    bank = quizzes.load_bank("lesson0")
    q = next(q for q in bank.questions if q.type == "single")
    correct = q.secret["correct"]
    wrong = next(o.id for o in q.options if o.id != correct)
    graded = sum(1 for x in bank.questions if x.type != "code")
    return bank, q, correct, wrong, graded


def choose(box, q, option_id):
    index = [o.id for o in q.options].index(option_id)
    box.locator(".widget-radio-box input[type=radio]").nth(index).check()


# --- The quiz and a plot in the browser ----------------------------------------------------------


@pytest.fixture(scope="module")
def check_page(lab_page, lab):
    """The small check notebook, opened in the shared page and run once (Run -> Run All Cells)."""
    from playwright.sync_api import expect

    page = lab_page.page
    check = open_from_path(page, CHECK_NB).show()
    wait_kernel_idle(page)
    run_all(page)
    cells = check.panel.locator(".jp-Notebook .jp-Cell")
    for i in range(3):
        wait_cell_done(cells.nth(i))
    page.screenshot(path=str(lab.tmp / "check_notebook.png"), full_page=True)
    assert_no_widget_failure(page, check.panel)
    expect(check.panel.locator(".quiz-root")).to_have_count(2)
    expect(check.panel.locator(".jp-OutputArea-output img")).to_have_count(1)
    return check


def shots_dir(lab) -> Path:
    """Where screenshots go: $COURSE_SCREENSHOTS when set (for a person to look at), else the
    test's temporary folder."""
    folder = Path(os.environ.get("COURSE_SCREENSHOTS") or lab.tmp)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def quiz_root(panel, index=0):
    return panel.locator(".quiz-root").nth(index)


@pytest.mark.browser
def test_quiz_feedback_and_score_show_in_the_cell(check_page, lab):
    from playwright.sync_api import expect

    import quizzes
    from quizzes import present

    page, panel = check_page.page, check_page.show().panel
    bank, q, correct, wrong, graded = lesson0_facts()
    root = quiz_root(panel)
    assert_no_widget_failure(page, panel)
    expect(root.locator(".quiz-question")).to_have_count(len(bank.questions))
    expect(root).to_contain_text(bank.title["en"])
    for where in ("top", "bottom"):  # the score at the top and at the bottom
        expect(root.locator(f".quiz-score-{where}")).to_have_text(f"Score: 0 / {graded}")

    box = root.locator(f".quiz-q-{q.id}")
    expect(box).to_contain_text(q.prompt["en"])
    feedback = box.locator(".quiz-feedback")

    # A wrong answer: the verdict at a glance, then why, in the cell (not in the log console).
    choose(box, q, wrong)
    box.get_by_role("button", name="Check").click()
    expect(feedback.locator(".quiz-verdict-wrong")).to_have_text("✘ Not right")
    wrong_result = quizzes.grade("lesson0", q.id, wrong, lang="en")
    expect(feedback).to_contain_text(
        present.body(wrong_result, "en").splitlines()[0].replace("`", "")
    )
    expect(root.locator(".quiz-score-bottom")).to_have_text(f"Score: 0 / {graded}")
    colour = feedback.locator(".quiz-verdict-wrong").evaluate("e => getComputedStyle(e).color")
    assert colour == "rgb(164, 14, 38)", colour  # red, not the text colour
    box.screenshot(path=str(shots_dir(lab) / "single_wrong_en.png"))

    # The right answer: feedback and score change. The old feedback goes as soon as the kernel
    # has the new choice (a choice waits while the kernel is busy; a click does not wait).
    choose(box, q, correct)
    expect(feedback).not_to_contain_text("Not right")
    box.get_by_role("button", name="Check").click()
    expect(feedback.locator(".quiz-verdict-correct")).to_have_text("✔ Correct")
    right = present.body(quizzes.grade("lesson0", q.id, correct, lang="en"), "en").replace("`", "")
    expect(feedback).to_contain_text(right.splitlines()[0])
    for where in ("top", "bottom"):
        expect(root.locator(f".quiz-score-{where}")).to_have_text(f"Score: 1 / {graded}")
    box.screenshot(path=str(shots_dir(lab) / "single_correct_en.png"))
    page.screenshot(path=str(lab.tmp / "quiz_answered.png"), full_page=True)

    # The feedback wraps at word boundaries: every line of it ends at a whole word.
    text = feedback.locator(".quiz-verdict-correct + div")
    text.evaluate("e => { e.style.maxWidth = '240px'; }")  # narrow enough to wrap
    lines = text.evaluate("""e => {
        const range = document.createRange(), out = [];
        const walk = document.createTreeWalker(e, NodeFilter.SHOW_TEXT);
        let top = null, line = '', node;
        while ((node = walk.nextNode())) {
            for (let i = 0; i < node.length; i++) {
                range.setStart(node, i); range.setEnd(node, i + 1);
                const t = range.getClientRects()[0]?.top;
                if (top !== null && t !== undefined && t > top + 2) { out.push(line); line = ''; }
                if (t !== undefined) top = t;
                line += node.data[i];
            }
        }
        out.push(line);
        return out;
    }""")
    text.evaluate("e => { e.style.maxWidth = ''; }")
    assert len(lines) >= 3, lines
    words = set(right.split())
    for line in lines[:-1]:
        last = line.rstrip().split()[-1] if line.strip() else ""
        assert not last or last in words or line.endswith((" ", "-", "/")), (line, lines)

    rec = wait_for(
        lambda: read_progress(lab).get("lessons", {}).get("lesson0", {}).get(q.id),
        what="the answer in the progress file",
    )
    assert rec["attempts"] == 2 and rec["correct"] is True and rec["best_score"] == 1.0
    assert rec["graded_by"] == "grader" and rec["verdict"] == "correct"


@pytest.mark.browser
def test_plot_renders_and_is_not_blank(check_page, lab):
    from PIL import Image, ImageStat

    img = check_page.show().panel.locator(".jp-OutputArea-output img")
    img.scroll_into_view_if_needed()
    size = img.evaluate("i => [i.naturalWidth, i.naturalHeight, i.complete]")
    assert size[2] and size[0] > 100 and size[1] > 100, f"the figure did not load: {size}"
    shot = lab.tmp / "plot.png"
    img.screenshot(path=str(shot))
    with Image.open(shot) as im:
        gray = im.convert("L")
        stddev = ImageStat.Stat(gray).stddev[0]
        colours = len(im.convert("RGB").getcolors(maxcolors=1 << 20) or [])
        width, height = im.size
    assert width > 100 and height > 100
    # A blank (or single-colour) figure has no variance; axes, labels and lines give plenty.
    assert stddev > 10, f"the plot screenshot looks blank (grey-level stddev {stddev:.1f}): {shot}"
    assert colours > 8, f"the plot screenshot has only {colours} colours: {shot}"


def english_ui_strings() -> list[str]:
    """The quiz's own English UI strings (not the questions'), as they would show."""
    from quizzes.i18n import MESSAGES

    out = set()
    for texts in MESSAGES.values():
        en = re.split(r"\{[^}]*\}", texts["en"])
        out.update(part.strip(" .,;:()") for part in en if len(part.strip(" .,;:()")) >= 5)
    return sorted(out - {"English"})


@pytest.mark.browser
def test_language_toggle_switches_and_is_remembered(check_page, lab):
    from playwright.sync_api import expect

    from quizzes.i18n import msg

    page, panel = check_page.page, check_page.show().panel
    bank, q, _, wrong, graded = lesson0_facts()
    root = quiz_root(panel)
    box = root.locator(f".quiz-q-{q.id}")
    expect(box).to_contain_text(q.prompt["en"])
    choose(box, q, wrong)  # feedback given in English is shown again in Chinese after the switch
    box.get_by_role("button", name="Check").click()
    expect(box.locator(".quiz-verdict-wrong")).to_have_text("✘ Not right")

    root.locator(".quiz-lang button", has_text="中文").click()
    expect(box).to_contain_text(q.prompt["zh"])
    expect(root).to_contain_text(bank.title["zh"])
    expect(box.locator(".quiz-verdict-wrong")).to_have_text("✘ 不对")
    expect(box.locator(".quiz-feedback")).to_contain_text(
        msg("selected_wrong", "zh", opt=wrong + ")")
    )
    expect(root.locator(".quiz-score-bottom")).to_contain_text("得分")
    wait_for(
        lambda: read_progress(lab).get("settings", {}).get("lang") == "zh",
        what='settings.lang == "zh" in the progress file',
    )
    assert_no_english_ui(root)

    # A new show() (the quiz cell run again) starts in Chinese.
    wait_cell_done(run_cell(page, panel, 0))
    root = quiz_root(panel)
    expect(panel.locator(".quiz-root")).to_have_count(2)
    expect(root.locator(f".quiz-q-{q.id}")).to_contain_text(q.prompt["zh"])
    expect(root.locator(".quiz-lang button.mod-active")).to_have_text("中文")
    expect(root.locator(".quiz-score-bottom")).to_have_text(f"得分：0 / {graded}")
    box = root.locator(f".quiz-q-{q.id}")
    box.get_by_role("button", name="检查").click()
    expect(box.locator(".quiz-feedback")).to_have_text(msg("pick_first", "zh"))
    assert_no_english_ui(root)
    page.screenshot(path=str(lab.tmp / "quiz_zh.png"), full_page=True)
    choose(box, q, wrong)
    box.get_by_role("button", name="检查").click()
    expect(box.locator(".quiz-verdict-wrong")).to_have_text("✘ 不对")
    box.screenshot(path=str(shots_dir(lab) / "single_wrong_zh.png"))
    choose(box, q, q.secret["correct"])
    box.get_by_role("button", name="检查").click()
    expect(box.locator(".quiz-verdict-correct")).to_have_text("✔ 正确")
    box.screenshot(path=str(shots_dir(lab) / "single_correct_zh.png"))
    assert_no_english_ui(root)

    # And back: English is remembered the same way.
    root.locator(".quiz-lang button", has_text="English").click()
    expect(root.locator(f".quiz-q-{q.id}")).to_contain_text(q.prompt["en"])
    expect(box.get_by_role("button", name="Check")).to_be_visible()
    wait_for(
        lambda: read_progress(lab).get("settings", {}).get("lang") == "en",
        what='settings.lang == "en" in the progress file',
    )


def assert_no_english_ui(root):
    """The quiz in Chinese: no English UI string in its rendered text (button labels included)."""
    from playwright.sync_api import expect

    # The score is drawn last when the language changes: once it is Chinese, all of it is.
    expect(root.locator(".quiz-score-bottom")).to_contain_text("得分")
    text = root.inner_text()
    buttons = root.locator("button").all_inner_texts()
    shown = text + "\n" + "\n".join(buttons)
    left = [s for s in english_ui_strings() if s in shown]
    assert not left, f"English UI strings in the Chinese quiz: {left}"
    assert "Check" not in buttons and "检查" in buttons


@pytest.mark.browser
def test_unsure_result_and_self_assessment_by_clicking(check_page, lab):
    """An open answer the grader is unsure of: what it found, missed and could not read, the
    reference, then the learner ticks the key ideas and marks the answer, recorded as
    self-assessed; the same in Chinese."""
    from playwright.sync_api import expect

    import quizzes

    panel = check_page.show().panel
    root = quiz_root(panel, 1)
    root.locator(".quiz-lang button", has_text="English").click()
    bank = quizzes.load_bank("lesson1")
    q = next(x for x in bank.questions if x.type == "open")
    graded = len(bank.graded())
    box = root.locator(f".quiz-q-{q.id}")
    box.scroll_into_view_if_needed()
    answer = (
        "FULL_SHARD frees the parameters after forward. And then it does the gather thing twice"
    )
    box.locator("textarea").fill(answer)
    box.get_by_role("button", name="Check").click()
    feedback = box.locator(".quiz-feedback")
    expect(feedback.locator(".quiz-verdict-unsure")).to_have_text("? Not sure: compare it yourself")
    for part in [
        "Key ideas found:",
        UNSURE_LABELS["en"][0],
        "Key ideas not found:",
        UNSURE_LABELS["en"][1],
        "Sentences the grader could not read:",
        "«And then it does the gather thing twice»",
        "You wrote «FULL_SHARD keeps them»: it frees them after forward",
        "Reference answer:",
        q.secret["reference"]["en"][:40],
    ]:
        expect(feedback).to_contain_text(part)
    check = box.locator(".quiz-selfcheck")
    expect(check).to_be_visible()
    ideas = check.locator(".quiz-idea input[type=checkbox]")
    expect(ideas).to_have_count(3)
    # what the grader found
    assert [ideas.nth(i).is_checked() for i in range(3)] == [True, False, False]
    right = check.locator(".quiz-self-right button, button.quiz-self-right").first
    expect(right).to_be_disabled()
    expect(check).to_contain_text("tick every key idea, and that nothing is false, first")
    box.screenshot(path=str(shots_dir(lab) / "open_unsure_en.png"))
    rec = wait_for(
        lambda: read_progress(lab).get("lessons", {}).get("lesson1", {}).get(q.id),
        what="the unsure answer in the progress file",
    )
    assert (rec["verdict"], rec["graded_by"], rec["correct"]) == ("unsure", "grader", False)

    ideas.nth(1).check()
    ideas.nth(2).check()
    expect(right).to_be_disabled()  # every key idea, but nothing false is not confirmed yet
    nothing_false = check.locator(".quiz-nothing-false input[type=checkbox]")
    expect(nothing_false).not_to_be_checked()
    nothing_false.check()
    expect(right).to_be_enabled()
    right.click()
    status = check.locator(".quiz-self-status")
    expect(status).to_contain_text("You marked it right")
    expect(status).to_contain_text("Recorded as self-assessed.")
    for where in ("top", "bottom"):
        expect(root.locator(f".quiz-score-{where}")).to_have_text(
            f"Score: 0 / {graded} (+1 self-assessed right)"
        )
    rec = wait_for(
        lambda: (
            (r := read_progress(lab)["lessons"]["lesson1"][q.id]).get("graded_by") == "self" and r
        ),
        what="the self-assessment in the progress file",
    )
    assert rec["self_correct"] is True and rec["correct"] is False and rec["attempts"] == 1
    box.screenshot(path=str(shots_dir(lab) / "open_self_right_en.png"))

    # In Chinese: the same result, every UI string translated, the ticks kept.
    root.locator(".quiz-lang button", has_text="中文").click()
    expect(feedback.locator(".quiz-verdict-unsure")).to_have_text("? 无法确定：请自己对照")
    expect(feedback).to_contain_text(UNSURE_LABELS["zh"][1])
    expect(status).to_contain_text("你判定为正确")
    assert [ideas.nth(i).is_checked() for i in range(3)] == [True, True, True]
    assert_no_english_ui(root)
    check.locator(".quiz-self-wrong button, button.quiz-self-wrong").first.click()
    expect(status).to_contain_text("你判定为不正确")
    expect(root.locator(".quiz-score-bottom")).to_have_text(f"得分：0 / {graded}")
    wait_for(
        lambda: read_progress(lab)["lessons"]["lesson1"][q.id].get("self_correct") is False,
        what="the changed self-assessment in the progress file",
    )
    box.screenshot(path=str(shots_dir(lab) / "open_self_wrong_zh.png"))
    root.locator(".quiz-lang button", has_text="English").click()  # the other tests expect English
    wait_for(
        lambda: read_progress(lab).get("settings", {}).get("lang") == "en",
        what='settings.lang == "en" in the progress file',
    )


@pytest.mark.browser
def test_open_answer_right_and_wrong(check_page, lab):
    """An open answer graded right and one graded wrong: the verdict at a glance, the self-check
    hidden (it is only for answers the grader is unsure of)."""
    from playwright.sync_api import expect

    import quizzes

    panel = check_page.show().panel
    root = quiz_root(panel, 1)
    q = next(x for x in quizzes.load_bank("lesson1").questions if x.type == "open")
    box = root.locator(f".quiz-q-{q.id}")
    feedback, check = box.locator(".quiz-feedback"), box.locator(".quiz-selfcheck")
    for lang, other in (("en", "English"), ("zh", "中文")):
        root.locator(".quiz-lang button", has_text=other).click()
        button = box.get_by_role("button", name={"en": "Check", "zh": "检查"}[lang])
        box.locator("textarea").fill(q.secret["reference"][lang])
        button.click()
        expect(feedback.locator(".quiz-verdict-correct")).to_be_visible()
        expect(check).to_be_hidden()
        box.screenshot(path=str(shots_dir(lab) / f"open_correct_{lang}.png"))
        box.locator("textarea").fill(
            {
                "en": "I had pizza for lunch and the weather was sunny today.",
                "zh": "今天午饭吃了披萨，天气很好，心情也不错。",
            }[lang]
        )
        button.click()
        expect(feedback.locator(".quiz-verdict-wrong, .quiz-verdict-partly")).to_be_visible()
        expect(check).to_be_hidden()
        box.screenshot(path=str(shots_dir(lab) / f"open_wrong_{lang}.png"))
    # And one the real grader is unsure of (from the labelled corpus, then the validation rounds;
    # none is a skip, said).
    graded = [
        (a["answer"], quizzes.grade("lesson1", q.id, a["answer"], lang="zh"))
        for folder in ("quizzes/labelled_answers", "tests/data/quiz_validation")
        for a in json.loads((REPO_ROOT / folder / "lesson1.json").read_text())["questions"][q.id]
        if a["lang"] == "zh"
    ]
    # an unread sentence, and a verdict the second reading withheld: each says why it is unsure
    for reason, why in (("unread", None), ("doubted_correct", "整体读起来不像")):
        unsure = [(a, r) for a, r in graded if r.details["reason"] == reason]
        if not unsure:
            pytest.skip(f"no Chinese answer of lesson 1's answer sets is graded {reason} ({q.id})")
        answer, expected = unsure[0]
        box.locator("textarea").fill(answer)
        box.get_by_role("button", name="检查").click()
        expect(feedback.locator(".quiz-verdict-unsure")).to_have_text("? 无法确定：请自己对照")
        expect(feedback).to_contain_text(why or expected.details["unread"][0])
        expect(check.locator(".quiz-idea")).to_have_count(len(expected.details["checklist"]))
        assert_no_english_ui(root)
        box.screenshot(path=str(shots_dir(lab) / f"open_unsure_{reason}_zh.png"))
    root.locator(".quiz-lang button", has_text="English").click()
    wait_for(
        lambda: read_progress(lab).get("settings", {}).get("lang") == "en",
        what='settings.lang == "en" in the progress file',
    )


# --- The home page and a real lesson notebook ---------------------------------------------------


@pytest.fixture(scope="module")
def home_page(lab_page, lab):
    """The home notebook (lab.sh's landing page) with its one cell run: the lesson table."""
    from playwright.sync_api import expect

    page = lab_page.page
    home = NotebookTab(page, "home.ipynb").show()
    wait_kernel_idle(page)
    nb = nbformat.read(lab.root / "lessons" / "home.ipynb", as_version=4)
    index = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    wait_cell_done(run_cell(page, home.panel, index))
    assert_no_widget_failure(page, home.panel)
    expect(home.panel.locator(".course-home-table table.course-home")).to_have_count(1)
    return home


@pytest.fixture(scope="module")
def lesson0_from_home(lab_page, home_page, lab):
    """Lesson 0 as a learner reaches it: the home table's link to it clicked. One lesson 0 notebook
    (and kernel) serves the home-page test and the lesson-0 test; nothing is run here: the
    lesson-0 test runs the cells it checks."""
    from playwright.sync_api import expect

    page = lab_page.page
    home_page.show()
    link = home_page.panel.locator(
        ".course-home-table a[href*='00_torchrun_ddp/00_torchrun_ddp.ipynb']"
    ).first
    expect(link, "the home page shows no link to lesson 0's notebook").to_be_visible()
    link.click()
    expect(
        page.locator(f"{DOCUMENT_TABS}.lm-mod-current", has_text="00_torchrun_ddp.ipynb"),
        "the home page's lesson 0 link did not bring lesson 0's notebook to the front",
    ).to_have_count(1)
    expect(page.locator(DOCUMENT_TABS, has_text="00_torchrun_ddp.ipynb")).to_have_count(1)
    return NotebookTab(page, "00_torchrun_ddp.ipynb")


@pytest.mark.browser
def test_home_page_opens_with_lesson_links(lab_page, lesson0_from_home, lab):
    """lab.sh's default URL opens lessons/home.ipynb; its links reach the lesson notebooks."""
    from playwright.sync_api import expect

    assert "/lab/tree/lessons/home.ipynb" in lab_page.landed_url, lab_page.landed_url
    # A notebook opens in a tab after the current one: the first tab is what the URL opened.
    expect(lab_page.page.locator(DOCUMENT_TABS).first).to_have_text("home.ipynb")
    nb = nbformat.read(lab.root / LESSON0, as_version=4)
    title = nb.cells[0].source.splitlines()[0].lstrip("# ")
    heading = lesson0_from_home.show().panel.locator(".jp-RenderedMarkdown h1").first
    expect(heading).to_contain_text(title)


@pytest.mark.browser
def test_home_table_updates_its_progress(home_page, lab, monkeypatch):
    """One table, titles without backticks, and progress that updates without running a cell:
    by itself when the progress file changes, and on Refresh."""
    from playwright.sync_api import expect

    import quizzes
    from quizzes import progress

    page, panel = home_page.page, home_page.show().panel
    table = panel.locator(".course-home-table table.course-home")
    expect(panel.locator("table")).to_have_count(1)  # one lesson table, not two
    assert "`" not in table.inner_text()
    row = table.locator("tr", has=page.locator("a[href*='03_no_sync']"))
    bank = quizzes.load_bank("lesson3")
    single = next(x for x in bank.questions if x.type == "single")
    other = next(x for x in bank.graded() if x.id != single.id)
    before = row.locator(".course-home-quiz").inner_text()
    assert "(0 answered)" in before, before
    expect(panel.locator(".course-home-stamp")).to_contain_text("updates by itself")
    monkeypatch.setenv(progress.ENV, str(lab.progress))
    # as a quiz in another notebook or a terminal records an answer
    assert progress.record("lesson3", progress.Mark(single.id, "correct", 1.0)).ok
    expect(row.locator(".course-home-quiz")).to_contain_text("(1 answered)")
    assert progress.record("lesson3", progress.Mark(other.id, "unsure", 0.5)).ok
    assert progress.record("lesson3", progress.Mark(other.id, "correct", graded_by="self")).ok
    panel.locator(".course-home-refresh").click()
    expect(row.locator(".course-home-quiz")).to_have_text(
        f"1 / {len(bank.graded())} correct, 1 self-assessed right (2 answered)"
    )
    panel.locator(".course-home-table").screenshot(path=str(shots_dir(lab) / "home_table.png"))
    page.screenshot(path=str(shots_dir(lab) / "home.png"))


@pytest.mark.browser
def test_lesson0_notebook_renders_its_quiz(lesson0_from_home, lab):
    """The real lesson 0 notebook: its import cell and its last cell (the quiz)."""
    from playwright.sync_api import expect

    from quizzes.i18n import msg

    nb = nbformat.read(lab.root / LESSON0, as_version=4)
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    first, last = code[0], code[-1]
    assert "import quizzes" in nb.cells[first].source
    assert "quizzes.show(" in nb.cells[last].source

    bank, _, _, _, graded = lesson0_facts()
    # Not the question the check notebook's quiz test answers: their progress records stay apart.
    q = [x for x in bank.questions if x.type == "single"][-1]
    correct = q.secret["correct"]
    page, panel = lesson0_from_home.page, lesson0_from_home.show().panel
    wait_kernel_idle(page)
    wait_cell_done(run_cell(page, panel, first))  # imports torch: slow on a busy machine
    cell = run_cell(page, panel, last)
    wait_cell_done(cell)
    errors = panel.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
    assert errors.count() == 0, errors.first.inner_text()
    assert_no_widget_failure(page, cell)
    root = cell.locator(".quiz-root")
    expect(root).to_have_count(1)
    expect(root.locator(".quiz-question")).to_have_count(len(bank.questions))
    expect(root).to_contain_text(bank.title["en"])

    # Check before choosing: the quiz asks for a choice. Choosing clears that message once the
    # kernel has the choice (a choice waits while the kernel is busy; a click does not wait).
    box = root.locator(f".quiz-q-{q.id}")
    feedback = box.locator(".quiz-feedback")
    box.get_by_role("button", name="Check").click()
    expect(feedback).to_have_text(msg("pick_first", "en"))
    choose(box, q, correct)
    expect(feedback).not_to_contain_text(msg("pick_first", "en"))
    box.get_by_role("button", name="Check").click()
    expect(feedback.locator(".quiz-verdict-correct")).to_have_text("✔ Correct")
    expect(root.locator(".quiz-score-bottom")).to_have_text(f"Score: 1 / {graded}")
    cell.screenshot(path=str(lab.tmp / "lesson0_quiz.png"))
    rec = wait_for(
        lambda: read_progress(lab).get("lessons", {}).get("lesson0", {}).get(q.id),
        what="the answer in the progress file",
    )
    assert rec["attempts"] == 1 and rec["correct"] is True, rec  # "choose first" is no attempt
