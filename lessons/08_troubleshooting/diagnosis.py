"""What a failed or hung job of lesson 8 tells, read with the real tools: the workers under a
launcher (found in /proc, as ``ps`` would), ``py-spy dump`` of each, the line each rank waits on,
the collective each rank says it runs (``TORCH_DISTRIBUTED_DEBUG=DETAIL``), and torchrun's
root-cause report.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def worker_pids(root_pid: int) -> dict[int, int]:
    """{rank: pid} of the torchrun workers below ``root_pid`` (read from /proc: RANK in their
    environment), as a learner would find them with ``ps`` on each node."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = {}, [root_pid]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            environ = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        env = dict(kv.split(b"=", 1) for kv in environ if b"=" in kv)
        if b"RANK" in env and b"TORCHELASTIC_RUN_ID" in env and b"LOCAL_RANK" in env:
            found[int(env[b"RANK"])] = pid
    return found


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise FileNotFoundError("py-spy is not installed: pip install py-spy")
    return found


def dump_stack(pid: int) -> str:
    """``py-spy dump --pid PID``: the Python stack of every thread of a live process."""
    result = subprocess.run([py_spy(), "dump", "--pid", str(pid)], capture_output=True, text=True,
                            timeout=20)
    return ANSI.sub("", result.stdout + result.stderr)  # py-spy colours its output


def waiting_line(stack: str, prefer: str = "train.py") -> dict:
    """The innermost frame of the main thread (where it waits), and the innermost frame in
    ``prefer`` (the line of the learner's own script that called it)."""
    main = stack.split("\nThread ")[1] if "\nThread " in stack else stack
    frames = re.findall(r"^\s+(\S+) \(([^)]+)\)$", main, flags=re.M)
    ours = next(((fn, where) for fn, where in frames if prefer in where), None)
    return {"innermost": " ".join(frames[0]) if frames else "?",
            "script_line": " ".join(ours) if ours else "?"}


def own_collectives(output: str) -> dict[str, dict]:
    """From ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` messages: the collective each rank says IT is
    running (``Rank N is running collective: CollectiveFingerPrint(SequenceNumber=S, OpType=OP``).
    The other side of each message ("but Rank M is running ...") is the checker's own exchange
    of fingerprints, not the peer's training collective."""
    found = re.findall(r"\[rank (\d+)\] error: .*?Rank \1 is running collective: "
                       r"CollectiveFingerPrint\(SequenceNumber=(\d+), OpType=(\w+)", output)
    return {rank: {"sequence": int(seq), "op": op} for rank, seq, op in found}


def _report_entry(body: str) -> dict:
    """One failure of torchrun's report as fields; ``exception``: its traceback's last line."""
    fields = dict(re.findall(r"^\s{2}(\w+)\s*: (.*)$", body, flags=re.M))
    after = body.split("traceback :", 1)[-1].splitlines()
    # not the report's ---- separator
    traceback_lines = [line.strip() for line in after if line.strip().strip("-")]
    fields["exception"] = traceback_lines[-1] if traceback_lines else ""
    return fields


def root_cause(output: str) -> dict:
    """torchrun's 'Root Cause (first observed failure)' section, field by field, with the error
    file it names; ``others``: the report's other failures (the echoes)."""
    head, found, tail = output.partition("Root Cause (first observed failure):")
    if not found:
        return {}
    fields = _report_entry(tail.split("=====", 1)[0])
    error_file = fields.get("error_file", "")
    if error_file and Path(error_file).is_file():
        fields["error_file_json"] = json.loads(Path(error_file).read_text())
    others = head.rpartition("Failures:")[2]
    fields["others"] = [_report_entry(b) for b in re.split(r"^\[\d+\]:$", others, flags=re.M)[1:]]
    return fields
