"""Reporting: one aligned metric line per log step on rank 0, and the metrics JSON file.

Metrics file (written by rank 0 with ``--metrics PATH``)::

    {"lesson": "lesson1", "world_size": 2, "backend": "gloo", "device": "cpu",
     "torch_version": "2.13.0+cpu", "config": {...the script's flags...},
     "history": [{"step": 0, "loss": 3.24, "ms": 41.0, "peak_mib": 9.1, "sent_mib": 9.3}, ...],
     "results": {...what the lesson measured...}}
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import tempfile
from pathlib import Path

import torch

from fsdp_course.dist import DistEnv

COLUMNS = (
    ("step", "{:>5d}"),
    ("loss", "{:>7.4f}"),
    ("ms/step", "{:>8.1f}"),
    ("peak MiB/rank", "{:>13.2f}"),
    ("sent MiB", "{:>9.3f}"),
)


class MetricLogger:
    """Prints ``step | loss | ms/step | peak MiB/rank | sent MiB`` on rank 0, keeps the history.

    A step the instruments did not watch passes ``peak_mib=None`` / ``sent_mib=None``: its
    line reads "-" there, never a false 0, and its history row keeps None."""

    def __init__(self, env: DistEnv, log_every: int = 1):
        self.env = env
        self.log_every = max(1, log_every)
        self.history: list[dict] = []
        self._printed_header = False

    def log(
        self,
        step: int,
        loss: float,
        ms: float,
        peak_mib: float | None,
        sent_mib: float | None,
        last: bool = False,
        **extra,
    ) -> None:
        """``last=True`` prints the line whatever ``log_every`` says (the final step, or the
        one step the instruments measured)."""
        row = {
            "step": step,
            "loss": loss,
            "ms": ms,
            "peak_mib": peak_mib,
            "sent_mib": sent_mib,
            **extra,
        }
        self.history.append(row)
        if not self.env.is_rank0 or not (step % self.log_every == 0 or last):
            return
        widths = [len(fmt.format(0 if "d" in fmt else 0.0)) for _, fmt in COLUMNS]
        if not self._printed_header:
            self.env.print0(" | ".join(name.rjust(w) for (name, _), w in zip(COLUMNS, widths)))
            self._printed_header = True
        values = (step, loss, ms, peak_mib, sent_mib)
        self.env.print0(
            " | ".join(
                "-".rjust(w) if v is None else fmt.format(v)
                for (_, fmt), v, w in zip(COLUMNS, values, widths)
            )
        )


def unwatched_ms(history: list[dict]) -> float | None:
    """ms/step that means something: the median of the steps no instrument watched (logged
    with ``peak_mib=None``), step 0 (first-step set-up) left out; None when there is none."""
    times = [row["ms"] for row in history if row["step"] > 0 and row["peak_mib"] is None]
    return statistics.median(times) if times else None


def _jsonable(value):
    if dataclasses.is_dataclass(value):
        return _jsonable(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (torch.device, torch.dtype, Path)):
        return str(value)
    if torch.is_tensor(value):
        return value.tolist()
    return value


def write_json_atomic(path: str | Path, data) -> None:
    """Write to a temporary file beside ``path``, then rename: never a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_metrics(
    path: str | None, lesson: str, env: DistEnv, config, history: list[dict], results: dict
) -> None:
    """Rank 0 writes the metrics file (format in the module docstring); others do nothing."""
    if not path or not env.is_rank0:
        return
    metrics = {
        "lesson": lesson,
        "world_size": env.world_size,
        "backend": env.backend,
        "device": env.device.type,
        "torch_version": torch.__version__,
        "config": config,
        "history": history,
        "results": results,
    }
    write_json_atomic(path, _jsonable(metrics))


def read_metrics(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())


def table(rows: list[dict], columns: list[str] | None = None) -> str:
    """A plain aligned text table (scripts print it; notebooks may prefer pandas-free HTML)."""
    if not rows:
        return ""
    columns = columns or list(rows[0])
    cells = [[_fmt(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = [
        " | ".join(c.rjust(w) for c, w in zip(columns, widths)),
        "-+-".join("-" * w for w in widths),
    ]
    lines += [" | ".join(v.rjust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join(lines)


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:,.0f}"
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 100_000:
        return f"{value:,}"  # byte counts: group the digits
    return str(value)
