"""Notebooks are stored without outputs or execution counts.

    python launch/notebooks.py --check [NOTEBOOK ...]   # list the notebooks with outputs, exit 1
    python launch/notebooks.py --strip [NOTEBOOK ...]   # clear them in place

With no NOTEBOOK: every .ipynb under lessons/. The pre-commit hook (.pre-commit-config.yaml)
runs --check on the notebooks a commit touches.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def lesson_notebooks() -> list[Path]:
    return sorted(
        p for p in (REPO / "lessons").rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts
    )


def dirty_cells(nb: dict) -> list[int]:
    """Indices of the code cells that carry outputs or an execution count."""
    return [
        i
        for i, cell in enumerate(nb.get("cells", []))
        if cell.get("cell_type") == "code"
        and (cell.get("outputs") or cell.get("execution_count") is not None)
    ]


def strip(nb: dict) -> None:
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            cell["outputs"] = []
            cell["execution_count"] = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="fail when a notebook has outputs")
    mode.add_argument("--strip", action="store_true", help="clear outputs and execution counts")
    parser.add_argument("notebooks", nargs="*", type=Path)
    args = parser.parse_args(argv)
    failed = False
    for path in args.notebooks or lesson_notebooks():
        try:
            nb = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            print(f"{path}: not a readable notebook ({exc})", file=sys.stderr)
            failed = True
            continue
        cells = dirty_cells(nb)
        if not cells:
            continue
        if args.check:
            print(
                f"{path}: outputs or execution counts in code cells {cells} "
                f"(clear them: python launch/notebooks.py --strip {path})",
                file=sys.stderr,
            )
            failed = True
        else:
            strip(nb)
            # nbformat's own layout: one-space indent, a final newline, non-ASCII kept
            path.write_text(
                json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n",
                encoding="utf-8",
            )
            print(f"{path}: cleared {len(cells)} code cells")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
