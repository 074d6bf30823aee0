#!/usr/bin/env bash
# launch/lint.sh: ruff over the repository, with the settings in pyproject.toml.
#
#   bash launch/lint.sh              # fix what ruff fixes safely, format, then list what is left
#   bash launch/lint.sh --check      # change nothing: what tests/test_tooling.py checks
#   bash launch/lint.sh ruff ARGS    # just `ruff ARGS` with the course's Python (the pre-commit
#                                    # hooks in .pre-commit-config.yaml call this)
#
# A fix run: unused `# noqa` comments go (a reason they give stays as a comment), `ruff check
# --fix`, `ruff format`, then it names the docstrings whose example the formatter re-indented
# and lists what needs a person: long strings and comments (E501; the formatter never splits
# a string), unused imports (F401: delete, or `# noqa: F401` when the import registers
# something), ambiguous names (E741), bugbear findings (B...).
# The Python: $PYTHON, else the active virtual environment's, else .venv's, else python3; ruff
# comes with the test extra (pip install -e '.[test]', which launch/setup.sh does).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/_common.sh"

mode=fix
case "${1:-}" in
    "") ;;
    --check) mode=check; shift ;;
    ruff) mode=ruff; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "lint.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
esac
if [[ $mode != ruff && $# -gt 0 ]]; then
    echo "lint.sh: unknown argument '$1' (try --help)" >&2; exit 2
fi

PY="$(course_python)"
if ! "$PY" -m ruff --version >/dev/null 2>&1; then
    echo "lint.sh: no ruff for $PY; install the test extra: $PY -m pip install -e '$COURSE_ROOT[test]'" >&2
    exit 2
fi
if [[ $mode == ruff ]]; then
    exec "$PY" -m ruff "$@"
fi

cd "$COURSE_ROOT"
if [[ $mode == check ]]; then
    rc=0
    "$PY" -m ruff check . || rc=1
    "$PY" -m ruff format --check . || rc=1
    exit "$rc"
fi
# A `# noqa` that suppresses nothing goes, but the reason it gives stays as a plain comment:
# `# noqa: BLE001 - one line, not a traceback` becomes `# one line, not a traceback` (ruff's
# own fix would delete the reason too; pyproject.toml marks RUF100 unfixable for that).
"$PY" - <<'PY'
import json
import re
import subprocess
import sys
from collections import defaultdict

found = subprocess.run(
    [sys.executable, "-m", "ruff", "check", "--exit-zero", "--output-format", "json", "."],
    capture_output=True, text=True, check=True,
).stdout
NOQA = re.compile(r"#\s*noqa(?::\s*[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*)?\s*(?:[-:]\s*)?(.*)$")
unused = defaultdict(list)  # file -> rows of a `# noqa` that suppresses nothing
for item in json.loads(found):
    message = item["message"]
    if item["code"] != "RUF100" or item["filename"].endswith(".ipynb"):
        continue
    if "unused" not in message and "non-enabled" not in message:
        continue  # a duplicated or unknown code: left to a person
    codes = set(re.findall(r"`([A-Z]+[0-9]+)`", message))
    unused[item["filename"]].append((item["location"]["row"], item["location"]["column"], codes))
for path, places in unused.items():
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    done = 0
    for row, column, codes in places:
        line = lines[row - 1]
        reason = NOQA.match(line[column - 1 :])
        if reason is None or reason.group(0).count("noqa") != 1:
            continue
        named = set(re.findall(r"[A-Z]+[0-9]+", reason.group(0)[: reason.start(1)]))
        if named - codes:
            continue  # some of its codes are still needed: left to a person
        text = reason.group(1).strip()
        lines[row - 1] = line[: column - 1].rstrip() + (f"  # {text}" if text else "")
        done += 1
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print(f"lint.sh: {path}: {done} unused noqa removed (a reason they gave is kept)")
PY
"$PY" -m ruff check --fix --exit-zero --quiet .
# The formatter re-indents a docstring whose lines after the first are all indented deeper
# (an example under a one-line summary): its example then loses its indent. Those are listed
# for a person to fix (a plain text line after the example keeps the indent).
docstrings() {
    "$PY" - "$1" <<'PY'
import ast
import json
import subprocess
import sys

found = {}
listed = subprocess.run(["git", "ls-files", "*.py"], capture_output=True, text=True)
files = listed.stdout.split()  # none outside a git checkout
for path in files:
    try:
        tree = ast.parse(open(path, encoding="utf-8").read())
    except (OSError, SyntaxError):
        continue
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                lines = [line.rstrip() for line in doc.rstrip().splitlines()]
                name = f"{path}: {getattr(node, 'name', 'module docstring')}"
                while name in found:  # a second method of the same name in the file
                    name += "'"
                found[name] = lines
with open(sys.argv[1], "w") as f:
    json.dump(found, f)
PY
}
before=$(mktemp) after=$(mktemp)
docstrings "$before"
"$PY" -m ruff format --quiet .
docstrings "$after"
"$PY" - "$before" "$after" <<'PY'
import json
import sys

before, after = (json.load(open(path)) for path in sys.argv[1:])
for name, lines in after.items():
    if name in before and before[name] != lines:
        print(f"lint.sh: {name}: the formatter re-indented this docstring; check its example")
PY
rm -f "$before" "$after"
# the count per rule of what is left; exit status 1 while anything is
"$PY" -m ruff check --statistics .
