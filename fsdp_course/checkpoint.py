"""Checkpoint plumbing that no lesson is about (lesson 4 shows the state-dict calls themselves).

- ``atomic_dir(final, env)``: every rank writes into a hidden temporary directory beside
  ``final``; rank 0 renames it to ``final`` only after all ranks finished. A kill during the
  save leaves a ``.tmp-*`` directory that nothing loads, and the previous checkpoint intact.
- ``published(root)`` / ``latest(root)`` / ``partial(root)`` / ``prune(root, keep)``: the
  checkpoints under a root directory (``step_000008`` ...), newest last.
- ``check_loadable(path, expected)``: a wrong path, a half-written checkpoint, a per-rank
  ``torch.save`` file or a checkpoint of another model -> one-line ``CourseError``.
- ``fingerprint(model, optimizer, rng=False)``: a SHA-256 per full (unsharded) tensor of the
  model and the optimizer state, the same whatever the world size: "bitwise equal" across runs
  and layouts; with ``rng=True`` also one per rank's RNG state.
- ``tensor_bytes(tree)``: bytes a (nested) state dict holds on this rank.
- ``CrashingWriter``: a DCP ``FileSystemWriter`` that kills its process after writing its own
  shard file, to show what a kill in the middle of a save leaves behind.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

from fsdp_course.dist import CourseError, say

STEP_DIR = re.compile(r"^step_(\d+)$")
METADATA = ".metadata"  # DCP's index, written last (by the coordinator rank)
FINGERPRINT = "fingerprint.json"


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step_{step:06d}"


def published(root: str | Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first (hidden ``.tmp-*`` ones never count)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if STEP_DIR.match(p.name) and (p / METADATA).is_file()]
    return sorted(found, key=lambda p: int(STEP_DIR.match(p.name).group(1)))


def latest(root: str | Path) -> Path | None:
    found = published(root)
    return found[-1] if found else None


def partial(root: str | Path) -> list[Path]:
    """Temporary directories a killed save left behind."""
    root = Path(root)
    return sorted(p for p in root.glob(".tmp-*")) if root.is_dir() else []


def prune(root: str | Path, keep: int) -> None:
    """Delete all but the newest ``keep`` checkpoints (call on one rank). ``keep`` is at least
    1: the newest checkpoint is the one a resume needs."""
    if keep < 1:
        raise ValueError(
            f"keep must be at least 1 (the newest checkpoint is the one a resume needs), got {keep}"
        )
    for old in published(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_dir(final: str | Path, is_rank0: bool):
    """``with atomic_dir(path, env.is_rank0) as tmp: dcp.save(state, checkpoint_id=tmp)``.

    All ranks write into ``.tmp-<name>``; after a barrier (every rank's files and DCP's
    ``.metadata`` are on disk) rank 0 renames it to ``final`` (``os.replace`` is atomic on one
    file system), then a second barrier. Assumes a file system all ranks share.
    """
    final = Path(final)
    tmp = final.parent / f".tmp-{final.name}"
    if is_rank0:
        shutil.rmtree(tmp, ignore_errors=True)  # a leftover of an earlier killed save
        tmp.mkdir(parents=True)
    dist.barrier()
    yield tmp
    dist.barrier()
    if is_rank0:
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    dist.barrier()


def list_files(path: str | Path) -> list[dict]:
    """``[{"file": name, "bytes": size}]`` for the files of a checkpoint directory (or file)."""
    path = Path(path)
    if path.is_file():
        return [{"file": path.name, "bytes": path.stat().st_size}]
    return [
        {"file": str(p.relative_to(path)), "bytes": p.stat().st_size}
        for p in sorted(path.rglob("*"))
        if p.is_file()
    ]


def local_part(t: torch.Tensor) -> torch.Tensor:
    """What this rank stores of ``t``: a DTensor's local shard, a ShardedTensor's local shards."""
    if hasattr(t, "to_local"):
        return t.to_local()
    if hasattr(t, "local_shards"):
        shards = [s.tensor.reshape(-1) for s in t.local_shards()]
        return torch.cat(shards) if shards else torch.empty(0, dtype=t.dtype)
    return t


def tensor_bytes(tree) -> int:
    """Bytes of the tensors in a nested state dict that this rank holds in memory."""
    if torch.is_tensor(tree):
        part = local_part(tree)
        return part.numel() * part.element_size()
    if isinstance(tree, dict):
        return sum(tensor_bytes(v) for v in tree.values())
    if isinstance(tree, (list, tuple)):
        return sum(tensor_bytes(v) for v in tree)
    return 0


def describe_tree(tree, prefix: str = "", limit: int | None = None) -> list[dict]:
    """``[{"key", "type", "shape", "bytes"}]`` for the tensors of a nested state dict."""
    rows = []

    def walk(node, key):
        if torch.is_tensor(node):
            part = local_part(node)
            rows.append(
                {
                    "key": key,
                    "type": type(node).__name__,
                    "shape": list(node.shape),
                    "local shape": list(part.shape),
                    "bytes": part.numel() * part.element_size(),
                }
            )
        elif isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                walk(v, f"{key}.{i}" if key else str(i))

    walk(tree, prefix)
    return rows[:limit] if limit else rows


def digest(t: torch.Tensor) -> str:
    t = t.detach().cpu().reshape(-1).contiguous()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"").hexdigest()[
        :16
    ]


def quiet_state_dict_warnings() -> None:
    """Silence what torch 2.13's state-dict code repeats on every call:
    ``FSDP.state_dict_type()`` is being deprecated (a FutureWarning: use ``get_state_dict`` /
    ``set_state_dict``, which serve classic FSDP, FSDP2 and DDP alike; lesson 4 shows it once),
    and internal notes (``_get_pg_default_device``, "Multiple backends", ShardedTensor)."""
    import warnings

    for message in (
        ".*_get_pg_default_device.*",
        ".*Multiple backends are registered.*",
        ".*Please use DTensor instead and we are deprecating ShardedTensor.*",
        ".*FSDP.state_dict_type\\(\\) and FSDP.set_state_dict_type\\(\\) are being deprecated.*",
    ):
        warnings.filterwarnings("ignore", message=message)


def rng_digests() -> dict:
    """``{"rng.rank0": sha, ...}``: every rank's CPU RNG state (collective: call on every rank)."""
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, digest(torch.get_rng_state()))
    return {f"rng.rank{rank}": state for rank, state in enumerate(states)}


def fingerprint(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, rng: bool = False
) -> dict:
    """SHA-256 (16 hex digits) of every full tensor of the model and the optimizer state, and
    with ``rng=True`` of every rank's RNG state.

    Collective: call on every rank. ``full_state_dict=True`` all-gathers each tensor;
    ``cpu_offload=False`` because classic FSDP's offload path fails on CPU ranks, where the
    tensors are in CPU memory already (``bash launch/lesson4.sh --bug offload-cpu`` runs it).
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, cpu_offload=False)
    result = {
        f"model.{k}": digest(v) for k, v in get_model_state_dict(model, options=options).items()
    }
    if optimizer is not None:
        osd = get_optimizer_state_dict(model, optimizer, options=options)
        for name, state in osd["state"].items():
            for k, v in state.items():
                if torch.is_tensor(v):
                    result[f"optim.{name}.{k}"] = digest(v)
    return {**result, **rng_digests()} if rng else result


def compare_fingerprints(a: dict, b: dict, only: tuple[str, ...] | None = None) -> dict:
    """``{"equal": bool, "tensors": n, "different": [keys...]}``; ``only``: key prefixes to
    compare, e.g. ``("model.", "optim.")`` to leave the per-rank RNG states out."""
    keys = sorted(k for k in set(a) | set(b) if only is None or k.startswith(only))
    different = [k for k in keys if a.get(k) != b.get(k)]
    return {"equal": not different, "tensors": len(keys), "different": different[:10]}


def check_loadable(path: str | Path, expected: dict[str, list[int]] | None = None) -> None:
    """One-line ``CourseError`` unless ``path`` is a complete DCP checkpoint of this model.

    ``expected`` maps flattened keys (``model.tok_emb.weight``) to global shapes; every one of
    them must be in the checkpoint with that shape.
    """
    path = Path(path)
    if not path.exists():
        raise CourseError(f"checkpoint {path} does not exist")
    if path.is_file():
        raise CourseError(
            f"{path} is a single file, not a DCP checkpoint directory "
            "(a torch.save file loads with torch.load; see the export section)"
        )
    if not (path / METADATA).is_file():
        names = sorted(p.name for p in path.iterdir())
        if any(n.endswith(".pt") for n in names):
            raise CourseError(
                f"{path} holds per-rank torch.save files ({', '.join(names[:4])}), "
                "not a DCP checkpoint: they load only on the same world size and wrapping"
            )
        raise CourseError(
            f"{path} has no {METADATA}: a half-written checkpoint (a save was killed "
            "before it finished) or not a DCP checkpoint"
        )
    if not expected:
        return
    stored = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    for key, shape in expected.items():
        if key not in stored:
            raise CourseError(
                f"{path} was saved from another model: it has no {key!r} "
                f"(it has e.g. {next(iter(stored))!r})"
            )
        size = getattr(stored[key], "size", None)
        if size is not None and list(size) != list(shape):
            raise CourseError(
                f"{path} was saved from another model: {key} has shape "
                f"{list(size)} there, {list(shape)} here"
            )


class CrashingWriter(FileSystemWriter):
    """Writes this rank's shard file, then SIGKILLs the process: a save killed half-way."""

    def write_data(self, plan, planner):
        future = super().write_data(plan, planner)
        future.wait()
        say(
            f"[rank {dist.get_rank()}] simulated crash while saving {Path(self.path).name}: SIGKILL"
        )
        os.kill(os.getpid(), signal.SIGKILL)
        return future


def read_json(path: str | Path) -> dict:
    import json

    return json.loads(Path(path).read_text())
