"""Lesson 4's pitfalls, run for real (imported by train.py for ``--demo torch-save,rng``).

- ``torch_save_pitfall``: ``torch.save(model.state_dict())`` (and the optimizer's) on every rank,
  for classic FSDP and for FSDP2: what each rank's file holds, which collectives it took, and
  what a single process gets when it loads rank 0's file.
- ``rng_dedup``: the script's own save_checkpoint / load_checkpoint with the same RNG seed on
  every rank, then with a seed per rank. The RNG state is one plain tensor under one key on
  every rank; DCP writes such a tensor once (it takes it for a replica), so every rank loads
  the same copy back.
"""

import re
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import FileSystemReader

from fsdp_course.checkpoint import digest, list_files, tensor_bytes
from fsdp_course.measure import CommCounter
from fsdp_course.model import GPT
from fsdp_course.report import table
from state_dicts import build_as, fresh_dir


def _one_line(exc: BaseException) -> str:
    """The line that says what went wrong: load_state_dict's first line is only a header, and
    its "While copying the parameter named ..." wraps the real error at the end."""
    lines = [line.strip() for line in str(exc).strip().splitlines()
             if not line.startswith("Error(s) in")]
    if not lines:
        return type(exc).__name__
    line = lines[0]
    copying = re.match(r'While copying the parameter named "([^"]+)".*an exception occurred : (.*)',
                       line)
    if copying:
        line = f"{copying.group(1)}: {copying.group(2).strip(chr(39) + '(),.')}"
    return f"{type(exc).__name__}: {line[:220]}"


def _try(what: str, fn) -> dict:
    try:
        fn()
        return {"what": what, "ok": True, "message": "loaded"}
    except Exception as exc:  # the failure is the lesson
        return {"what": what, "ok": False, "message": _one_line(exc)}


def _gather_rows(mine: dict, env) -> list[dict]:
    rows = [None] * env.world_size
    dist.all_gather_object(rows, mine)
    return rows


def _save_per_rank(model, optimizer, path: Path, env) -> dict:
    """What the pitfall does: every rank saves what its state_dict() calls return."""
    with CommCounter() as comm:
        model_sd = model.state_dict()
    optim_sd = optimizer.state_dict()  # plain torch: what this rank's optimizer holds
    torch.save({"model": model_sd, "optim": optim_sd}, path)
    first = next(iter(model_sd.values()))
    return {"rank": env.rank, "file": path.name, "file_bytes": path.stat().st_size,
            "tensor type": type(first).__name__, "model_tensors": len(model_sd),
            "model bytes held": tensor_bytes(model_sd),
            "model bytes the shapes say": sum(4 * v.numel() for v in model_sd.values()),
            "optim_keys": list(optim_sd["state"])[:4],
            "optim_bytes": tensor_bytes(optim_sd["state"]),
            "collectives": comm.summary()}


def _load_fsdp2_file(path: Path, plain: torch.nn.Module) -> list[dict]:
    """A single process with rank 0's FSDP2 file: torch.load, then a plain model."""
    allowed = torch.serialization.get_safe_globals()
    # Importing torch.distributed.tensor puts DTensor and its parts on torch.load's allow-list
    # (torch/distributed/tensor/__init__.py). Off the list, as in a process that imported
    # only torch, a weights_only load refuses the file:
    torch.serialization.clear_safe_globals()
    try:
        refused = _try("torch.load(rank0.pt) after `import torch` only",
                       lambda: torch.load(path, weights_only=True))
    finally:
        torch.serialization.add_safe_globals(allowed)
    loaded = torch.load(path, weights_only=True)["model"]
    tok = loaded["tok_emb.weight"]
    rows = [refused, {"what": "torch.load(rank0.pt) with torch.distributed.tensor imported",
                      "ok": True,
                      "message": f"{type(tok).__name__} tok_emb.weight: shape {list(tok.shape)}, "
                                 f"holds {list(tok.to_local().shape)}"}]
    rows.append(_try("plain GPT.load_state_dict(those DTensors)",
                     lambda: plain.load_state_dict(loaded)))
    rows.append(_try("plain GPT.load_state_dict(their to_local() parts)",
                     lambda: plain.load_state_dict({k: v.to_local() for k, v in loaded.items()})))
    return rows


def torch_save_pitfall(model, optimizer, env, out_dir) -> dict:
    out_dir = fresh_dir(Path(out_dir), env)
    fsdp2_model, fsdp2_optimizer = build_as("FSDP2", model.module.cfg,
                                            optimizer.param_groups[0]["lr"], 0, env.device)
    # Classic FSDP's default state dict is FULL_STATE_DICT: it all-gathers every unit, so EVERY
    # rank must call it (a collective), and every rank ends up holding the full model.
    classic = _gather_rows(_save_per_rank(model, optimizer, out_dir / f"rank{env.rank}.pt", env),
                           env)
    # FSDP2's state dict is its DTensor shards, gathered by nobody: each rank saves only its part.
    fsdp2 = _gather_rows(_save_per_rank(fsdp2_model, fsdp2_optimizer,
                                        out_dir / f"fsdp2_rank{env.rank}.pt", env), env)
    result = {"classic": classic, "fsdp2": fsdp2,
              "num_params": sum(p.numel() for p in GPT(model.module.cfg).parameters())}
    if env.is_rank0:
        plain = GPT(model.module.cfg)
        saved = torch.load(out_dir / "rank0.pt", weights_only=True)
        result["classic_loads"] = [
            _try("plain GPT.load_state_dict(rank0.pt['model'])",
                 lambda: plain.load_state_dict(saved["model"])),
            _try("plain AdamW.load_state_dict(rank0.pt['optim'])",
                 lambda: torch.optim.AdamW(plain.parameters()).load_state_dict(saved["optim"]))]
        result["fsdp2_loads"] = _load_fsdp2_file(out_dir / "fsdp2_rank0.pt", GPT(model.module.cfg))
        columns = ["rank", "file", "file_bytes", "tensor type", "model bytes held",
                   "model bytes the shapes say",
                   "optim_keys", "optim_bytes"]
        for name in ("classic", "fsdp2"):
            env.print0(f"\ntorch.save(model.state_dict()) on every rank, {name}:")
            env.print0(table([{k: r[k] for k in columns} for r in result[name]]))
            env.print0("collectives in model.state_dict() on rank 0: "
                       f"{result[name][0]['collectives'] or 'none'}")
            env.print0(table(result[f"{name}_loads"]))
    return result


def _rng_file(path: Path) -> str:
    """Which file of a DCP checkpoint holds the RNG state (DCP's .metadata says)."""
    storage = FileSystemReader(str(path)).read_metadata().storage_data
    return ", ".join(sorted({v.relative_path for k, v in storage.items()
                             if k.fqn == "trainer.rng"}))


def rng_dedup(model, optimizer, env, out_dir, save_fn, load_fn, build_fresh) -> dict:
    """save_fn / load_fn: the script's own; build_fresh(): a new model (another init). Reseeds:
    the caller keeps its own RNG state (torch.random.fork_rng)."""
    out_dir = fresh_dir(Path(out_dir), env)
    rows, files = [], {}
    for case in ("same seed", "seed per rank"):
        if case == "seed per rank":
            torch.manual_seed(1000 + env.rank)  # e.g. for dropout masks that differ per rank
        saved = torch.get_rng_state()
        path = out_dir / case.replace(" ", "_")
        save_fn(path, model, optimizer)
        fresh, fresh_optimizer = build_fresh()  # another init: the RNG is elsewhere now
        load_fn(path, fresh, fresh_optimizer)
        restored = torch.get_rng_state()
        expected = torch.rand(1, generator=torch.Generator().set_state(saved)).item()
        rows += _gather_rows({"case": case, "rank": env.rank, "saved RNG": digest(saved)[:8],
                              "restored RNG": digest(restored)[:8],
                              "own state back": torch.equal(restored, saved),
                              "next rand() expected": round(expected, 6),
                              "next rand() after load": round(torch.rand(1).item(), 6)}, env)
        files[case] = _rng_file(path) if env.is_rank0 else None
    env.print0("\nthe RNG state through the script's save_checkpoint / load_checkpoint:")
    env.print0(table(rows))
    env.print0(f"files holding trainer.rng: {files}; all files: "
               f"{[f['file'] for f in list_files(out_dir / 'seed_per_rank')]}")
    return {"rows": rows, "rng_file": files}
