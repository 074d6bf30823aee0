"""Every lesson notebook, executed with the worked solutions swapped into its exercise cells.

(The plain top-to-bottom run is nbval's: pytest collects ``lessons/**/*.ipynb`` with
``--nbval-lax --nbval-current-env``, see pyproject.toml.) Exercise cells carry the tag
``exercise:NAME``; ``solutions/NAME.py`` is the full content that replaces them. Cells tagged
``check`` grade the exercises and must print PASS once the solutions are in.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for p in (REPO / "lessons").glob("*/*.ipynb")
                   if ".ipynb_checkpoints" not in p.parts)


def exercise_tags(cell) -> list[str]:
    return [t.split(":", 1)[1] for t in cell.get("metadata", {}).get("tags", [])
            if t.startswith("exercise:")]


def cell_text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append(out.get("text", ""))
        data = out.get("data", {})
        parts.append(data.get("text/plain", ""))
    return "".join(parts)


def execute(nb, cwd: Path):
    # jupyter_client starts the "python3" kernel with this very interpreter (sys.executable).
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(cwd)}})
    return client.execute()


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_with_solutions_passes_every_check(path: Path):
    nb = nbformat.read(path, as_version=4)
    exercises = [c for c in nb.cells if exercise_tags(c)]
    checks = [c for c in nb.cells if "check" in c.get("metadata", {}).get("tags", [])]
    assert len(checks) >= len(exercises), f"{path.name}: every exercise needs a check cell"
    for cell in exercises:
        for name in exercise_tags(cell):
            solution = REPO / "solutions" / f"{name}.py"
            assert solution.is_file(), f"{path.name}: exercise {name} has no solutions/{name}.py"
            cell.source = solution.read_text()

    execute(nb, path.parent)

    for cell in checks:
        text = cell_text(cell)
        assert "PASS" in text and "FAIL" not in text and "not attempted" not in text, (
            f"{path.name}: a check cell did not pass with the solutions in:\n{text}")
