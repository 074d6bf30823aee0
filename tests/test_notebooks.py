"""Every notebook, executed once top to bottom the way a learner first meets it, and graded again
with the worked solutions in, in the same kernel.

Exercise cells carry the tag ``exercise:NAME``; ``solutions/NAME.py`` is the full content that
replaces them. Cells tagged ``check`` grade the exercises. After each check cell the test
inserts the solutions of the exercises above it and a copy of the check cell: the original
check must say "not attempted yet" (what a learner sees before trying), the copy must PASS.
Executing each notebook once (instead of once plain and once with the solutions) halves the
notebooks' share of the suite.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(
    p for p in (REPO / "lessons").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts
)
SOLVED = "solution-check"  # marks the inserted copies of check cells
FIGURE_CHECKS = "import course_lab.figures\ncourse_lab.figures.install_checks()"
REVEAL_ALL = "import course_lab.predict\ncourse_lab.predict.reveal_all()"


def exercise_tags(cell) -> list[str]:
    return [
        t.split(":", 1)[1]
        for t in cell.get("metadata", {}).get("tags", [])
        if t.startswith("exercise:")
    ]


def is_check(cell) -> bool:
    return "check" in cell.get("metadata", {}).get("tags", [])


def cell_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append(out.get("text", ""))
        data = out.get("data", {})
        parts.append(data.get("text/plain", ""))
    return "".join(parts)


# A number in a notebook's prose must be printed by one of its outputs (issue: "measured
# truth"): numbers with a thousands separator, a decimal point, a % or an exponent, or two or
# more digits. Not checked: numbers inside `code` or $math$, lesson numbers ("lesson 3",
# "lessons 1-5"), years, link targets, and dotted addresses or versions (127.0.0.1, 2.13.0,
# torch 2.13).
NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+\.\d+|\d+)(%|e[-+]?\d+)?(?![\w])")
NOT_PROSE = re.compile(
    r"`[^`]*`|\$[^$]*\$|\]\([^)]*\)|<[^>]*>|\b[Ll]essons? \d+(?:\s*[-–,]\s*\d+)*"
    r"|\b\d+(?:\.\d+){2,}\b"  # ... and addresses or versions: 127.0.0.1, 2.13.0
    r"|\b(?:torch|accelerate|Python) \d+(?:\.\d+)+"
)


def prose_numbers(markdown: str) -> list[str]:
    """The numbers a markdown cell states in prose (see NUMBER and NOT_PROSE)."""
    found = []
    for line in markdown.splitlines():
        if line.lstrip().startswith("#"):
            line = re.sub(r"^\s*#+\s*\d+(\.\d+)*\.?", "", line)  # "## 3. Title"
        line = re.sub(r"^\s*\d+\.\s", "", line)  # a numbered list item
        for number, suffix in NUMBER.findall(NOT_PROSE.sub(" ", line)):
            token = number + (suffix or "")
            plain = number.replace(",", "")
            if (
                "." not in plain
                and not suffix
                and (len(plain) < 2 or (len(plain) == 4 and plain.startswith(("19", "20"))))
            ):
                continue  # one digit, or a year
            found.append(token)
    return found


def output_text(nb) -> str:
    """Everything the executed notebook printed or displayed, thousands separators removed."""
    outputs = [
        out for cell in nb.cells if cell.cell_type == "code" for out in cell.get("outputs", [])
    ]
    # ... and what an Output widget holds: a table that waits for a prediction
    # (course_lab.predict.until_locked) is in the notebook's widget state, not in a cell.
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    for model in state.get("state", {}).values():
        if model.get("model_name") == "OutputModel":
            outputs.extend(model.get("state", {}).get("outputs", []))
    parts = []
    for out in outputs:
        parts.append(out.get("text", ""))
        parts.append(out.get("evalue", ""))
        for kind in ("text/plain", "text/html", "text/markdown"):
            parts.append(out.get("data", {}).get(kind, ""))
    return re.sub(r"(?<=\d),(?=\d{3})", "", "".join(str(p) for p in parts))


def unprinted_numbers(nb) -> list[str]:
    printed = output_text(nb)
    missing = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for token in prose_numbers(cell.source):
                if token.replace(",", "") not in printed:
                    missing.append(token)
    return missing


# The same rule for what a learner reads next to a notebook: its quiz's explanations (each option's
# why, a numeric answer's explanation, an open question's reference and feedback) and the docs
# pages that rest on its runs. A number the question itself gives (in its prompt or options) is
# data, not a claim; arithmetic on it goes in `code`, like the notebooks' formulas.
DOCS_OF_NOTEBOOK = {"08_troubleshooting": ["docs/troubleshooting.md", "docs/ecosystem.md"]}
# Lessons whose quiz explanations are held to it (lessons 0-5's: not yet, their truth pass is
# separate).
QUIZ_CHECKED = ("06_silent_bugs", "07_memory", "08_troubleshooting")


def quiz_texts(lesson: str) -> list[tuple[str, str, set]]:
    """(where, English text, the numbers the question gives) for every explanation in the bank."""
    from quizzes.bank import load_bank

    found = []
    for q in load_bank(lesson):
        given = set(prose_numbers(" ".join([q.prompt["en"], *(o.text["en"] for o in q.options)])))
        secret = q.secret
        texts = {f"why {k}": v for k, v in secret.get("why", {}).items()}
        for key in ("explanation", "reference"):
            if key in secret:
                texts[key] = secret[key]
        for item in [*secret.get("claims", []), *secret.get("misconceptions", [])]:
            for form in item.get("forms", [item]):
                for key in ("wrong", "swapped"):
                    if key in form:
                        texts[f"{item['id']} {key}"] = form[key]
        found += [
            (f"{lesson} {q.id} ({where})", text["en"], given) for where, text in texts.items()
        ]
    return found


def unprinted_in_companions(nb, notebook: str) -> list[str]:
    """Numbers in the notebook's quiz explanations and docs pages that no output of it prints."""
    printed = output_text(nb)
    texts = quiz_texts(f"lesson{int(notebook[:2])}") if notebook in QUIZ_CHECKED else []
    texts += [
        (page, (REPO / page).read_text(), set()) for page in DOCS_OF_NOTEBOOK.get(notebook, [])
    ]
    missing = []
    for where, text, given in texts:
        for token in prose_numbers(text):
            if token not in given and token.replace(",", "") not in printed:
                missing.append(f"{where}: {token}")
    return missing


def with_solutions_after_checks(nb) -> tuple[list, list]:
    """Insert, after each check cell, the solutions of the exercises above it and a copy of the
    check. Returns (original check cells, inserted copies), in order."""
    cells, originals, copies, pending = [], [], [], []
    for cell in nb.cells:
        cells.append(cell)
        pending += exercise_tags(cell)
        if is_check(cell) and pending:
            originals.append(cell)
            for name in pending:
                solution = REPO / "solutions" / f"{name}.py"
                assert solution.is_file(), f"exercise {name} has no solutions/{name}.py"
                cells.append(nbformat.v4.new_code_cell(solution.read_text()))
            again = copy.deepcopy(cell)
            again.metadata["tags"] = [*again.metadata.get("tags", []), SOLVED]
            again.pop("id", None)
            cells.append(again)
            copies.append(again)
            pending = []
    assert not pending, f"exercises {pending} have no check cell after them"
    nb.cells = cells
    return originals, copies


def execute(nb, cwd: Path):
    # jupyter_client starts the "python3" kernel with this very interpreter (sys.executable);
    # the kernel inherits the suite's private progress file and its launch cache.
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}
    )
    return client.execute()


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_untouched_then_passes_with_the_solutions(path: Path):
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), (
        f"{path.name} is stored with outputs: clear them (jupyter nbconvert --clear-output)"
    )
    nb.metadata.setdefault(
        "kernelspec", {"name": "python3", "display_name": "Python 3", "language": "python"}
    )
    originals, copies = with_solutions_after_checks(nb)
    # Every figure the notebook shows must read at a glance (course_lab.figures.check: no text
    # on top of other text, a legend where there are several series): a figure that does not
    # fails its cell. At the end, every prediction must hold its measurement (hidden from the
    # learner until a guess, but measured: course_lab.predict.reveal_all prints them all).
    nb.cells.insert(0, nbformat.v4.new_code_cell(FIGURE_CHECKS))
    nb.cells.append(nbformat.v4.new_code_cell(REVEAL_ALL))

    execute(nb, path.parent)  # raises CellExecutionError, with the cell, if any cell fails

    for cell in originals:
        text = cell_text(cell)
        assert "not attempted yet" in text and "PASS" not in text, (
            f"{path.name}: an untouched exercise's check should say 'not attempted yet':\n{text}"
        )
    for cell in copies:
        text = cell_text(cell)
        assert "PASS" in text and "FAIL" not in text and "not attempted" not in text, (
            f"{path.name}: a check cell did not pass with the solutions in:\n{text}"
        )
    missing = unprinted_numbers(nb) + unprinted_in_companions(nb, path.stem)
    assert not missing, (
        f"{path.name}: numbers stated in the text (or in its quiz's explanations, "
        f"or its docs pages) that no output of the notebook prints (print them "
        f"from the code that measured them, or drop them): {missing}"
    )


def test_numbers_in_prose_must_be_printed():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell(
            "## 2. Lesson 3 in 2026\n1. The root holds 15,387 parameters, 3.08 MiB, rel err 6% "
            "on 2 ranks (`--steps 20`, $16P/N$) at 127.0.0.1 with torch 2.13.0, see [x](a/12.html)."
        ),
        nbformat.v4.new_code_cell(""),
    ]
    assert prose_numbers(nb.cells[0].source) == ["15,387", "3.08", "6%"]
    nb.cells[1].outputs = [nbformat.v4.new_output("stream", text="root 15387 | 3.084 MiB\n")]
    assert unprinted_numbers(nb) == ["6%"]


def test_quiz_explanations_and_docs_pages_are_checked_too():
    texts = {where: (text, given) for where, text, given in quiz_texts("lesson6")}
    text, given = texts["lesson6 q_reduce_bytes (explanation)"]
    assert "50,000,000" in given  # the question's own data
    silent = nbformat.v4.new_notebook()  # prints nothing: every stated number is missing
    missing = unprinted_in_companions(silent, "08_troubleshooting")
    assert "docs/troubleshooting.md: 16,777,216" in missing
    assert any(m.startswith("lesson8 q_") for m in missing)
    assert prose_numbers("torch 2.13 and accelerate 1.15.0, 17 steps") == ["17"]


def test_solutions_are_inserted_after_their_check(tmp_path):
    nb = nbformat.v4.new_notebook()
    exercise = nbformat.v4.new_code_cell("def f():\n    raise NotImplementedError")
    exercise.metadata["tags"] = ["exercise:lesson1_predict_bytes"]
    check = nbformat.v4.new_code_cell("check(f)")
    check.metadata["tags"] = ["check"]
    nb.cells = [nbformat.v4.new_code_cell("x = 1"), exercise, check, nbformat.v4.new_code_cell("y")]
    originals, copies = with_solutions_after_checks(nb)
    sources = [c.source for c in nb.cells]
    assert sources[:3] == ["x = 1", exercise.source, "check(f)"]
    assert sources[3] == (REPO / "solutions" / "lesson1_predict_bytes.py").read_text()
    assert sources[4:] == ["check(f)", "y"] and originals == [check] and copies == [nb.cells[4]]
