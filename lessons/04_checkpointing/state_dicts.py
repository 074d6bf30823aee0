"""Lesson 4's tour of classic FSDP state dicts (imported by train.py for ``--demo``).

- ``torch_save_pitfall``: ``torch.save(model.state_dict())`` and ``torch.save(optimizer.state_dict())``
  on every rank: what each rank writes, which collectives that needed, what a plain model can load.
- ``compare_types``: FULL_STATE_DICT (rank0_only), SHARDED_STATE_DICT, LOCAL_STATE_DICT and DCP's
  ``get_state_dict``: time, bytes held per rank, files written, round trip into a fresh model.
"""

import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     get_state_dict, set_state_dict)
from torch.distributed.fsdp import FullOptimStateDictConfig, FullStateDictConfig
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import (LocalOptimStateDictConfig, LocalStateDictConfig,
                                    ShardedOptimStateDictConfig, ShardedStateDictConfig,
                                    StateDictType)

from fsdp_course.checkpoint import describe_tree, list_files, tensor_bytes
from fsdp_course.measure import CommCounter
from fsdp_course.model import GPT
from fsdp_course.report import table


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:160]}" if lines else type(exc).__name__


def _fresh_dir(path: Path, env) -> Path:
    if env.is_rank0:
        import shutil

        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    dist.barrier()
    return path


def _try(what, fn) -> dict:
    try:
        fn()
        return {"what": what, "ok": True, "message": "loaded"}
    except Exception as exc:  # noqa: BLE001 - the failure is the lesson
        return {"what": what, "ok": False, "message": _one_line(exc)}


def torch_save_pitfall(model, optimizer, env, out_dir) -> dict:
    out_dir = _fresh_dir(Path(out_dir), env)
    with CommCounter() as comm:
        # Classic FSDP's default state dict is FULL_STATE_DICT: it all-gathers every unit, so
        # EVERY rank must call it (a collective) and every rank ends up holding the full model.
        model_sd = model.state_dict()
    optim_sd = optimizer.state_dict()  # plain torch: this rank's shard of each flat parameter
    path = out_dir / f"rank{env.rank}.pt"
    torch.save({"model": model_sd, "optim": optim_sd}, path)
    mine = {"rank": env.rank, "file": path.name, "file_bytes": path.stat().st_size,
            "model_tensors": len(model_sd), "model_bytes": tensor_bytes(model_sd),
            "optim_keys": list(optim_sd["state"]), "optim_bytes": tensor_bytes(optim_sd["state"]),
            "optim_shapes": {k: list(v["exp_avg"].shape) for k, v in optim_sd["state"].items()},
            "collectives": comm.summary()}
    per_rank = [None] * env.world_size
    dist.all_gather_object(per_rank, mine)
    result = {"per_rank": per_rank, "model_rows": describe_tree(model_sd, limit=4),
              "num_params": sum(p.numel() for p in model_sd.values())}
    if env.is_rank0:
        # What a single-process user of the file gets: a plain GPT and a plain AdamW.
        saved = torch.load(path, weights_only=True)
        plain = GPT(model.module.cfg)
        plain_optimizer = torch.optim.AdamW(plain.parameters())
        result["loads"] = [
            _try("plain GPT.load_state_dict(rank0.pt['model'])", lambda: plain.load_state_dict(saved["model"])),
            _try("plain AdamW.load_state_dict(rank0.pt['optim'])", lambda: plain_optimizer.load_state_dict(saved["optim"])),
        ]
        print("\ntorch.save on every rank (classic FSDP, default state dict):")
        print(table([{k: r[k] for k in ("rank", "file", "file_bytes", "model_tensors", "model_bytes",
                                        "optim_keys", "optim_bytes")} for r in per_rank]))
        print(f"model.state_dict() needed these collectives on every rank: {mine['collectives']}")
        print(table(result["loads"]))
    return result


KINDS = {
    # rank0_only: only rank 0 keeps the gathered copy. offload_to_cpu=False: on CPU ranks the
    # tensors are on the CPU already, and True crashes classic FSDP there (CPU_NOTES trap 2).
    "FULL_STATE_DICT": (StateDictType.FULL_STATE_DICT,
                        FullStateDictConfig(rank0_only=True, offload_to_cpu=False),
                        FullOptimStateDictConfig(rank0_only=True, offload_to_cpu=False)),
    "SHARDED_STATE_DICT": (StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(),
                           ShardedOptimStateDictConfig()),
    "LOCAL_STATE_DICT": (StateDictType.LOCAL_STATE_DICT, LocalStateDictConfig(),
                         LocalOptimStateDictConfig()),
}
WHO_LOADS = {
    "FULL_STATE_DICT": "anyone: plain torch.load, any world size, FSDP or not",
    "SHARDED_STATE_DICT": "FSDP or plain model at any world size, through DCP",
    "LOCAL_STATE_DICT": "only the same world size and the same wrapping",
    "DCP get_state_dict": "FSDP, FSDP2 or plain model at any world size, through DCP",
}


def _moved(comm) -> int:
    """Bytes all-gathered or broadcast: what had to travel to build the state dict."""
    return comm.bytes.get("all_gather", 0) + comm.bytes.get("broadcast", 0)


def _snapshot(model, optimizer) -> list[torch.Tensor]:
    """This rank's flat-parameter shards and their Adam state, in parameter order."""
    return [p.detach().clone() for p in model.parameters()] + [
        optimizer.state[p][k].clone() for p in model.parameters() for k in sorted(optimizer.state[p])]


def _save(kind, state, out: Path, env):
    if kind == "FULL_STATE_DICT":
        if env.is_rank0:  # rank0_only: the others hold empty dicts
            torch.save(state, out / "full.pt")
    elif kind == "LOCAL_STATE_DICT":
        torch.save(state, out / f"local_rank{env.rank}.pt")
    else:  # ShardedTensors: DCP writes each rank's shards plus one .metadata index
        dcp.save(state, checkpoint_id=out)
    dist.barrier()


def _load(kind, model, optimizer, out: Path, env):
    if kind == "DCP get_state_dict":
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=out)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        return
    state_type, model_config, optim_config = KINDS[kind]
    if kind == "FULL_STATE_DICT":
        # Loading a full state dict: every rank needs the whole model (rank0_only=False);
        # the optimizer state may come from rank 0 alone (rank0_only=True scatters it).
        model_config = FullStateDictConfig(rank0_only=False, offload_to_cpu=False)
        state = torch.load(out / "full.pt", weights_only=True)
        if not env.is_rank0:
            state["optim"] = {}
    elif kind == "LOCAL_STATE_DICT":
        state = torch.load(out / f"local_rank{env.rank}.pt", weights_only=False)  # ShardedTensors
    with FSDP.state_dict_type(model, state_type, model_config, optim_config):
        if kind == "SHARDED_STATE_DICT":
            state = {"model": model.state_dict(), "optim": FSDP.optim_state_dict(model, optimizer)}
            dcp.load(state, checkpoint_id=out)  # in place, into this run's shards
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(FSDP.optim_state_dict_to_load(model, optimizer, state["optim"]))


def compare_types(model, optimizer, env, out_dir, build_fresh) -> dict:
    out_dir = _fresh_dir(Path(out_dir), env)
    reference = _snapshot(model, optimizer)
    rows = []
    for kind in (*KINDS, "DCP get_state_dict"):
        out = _fresh_dir(out_dir / kind.split()[0].lower(), env)
        start = time.perf_counter()
        with FSDP.state_dict_type(model, *KINDS[kind]) if kind in KINDS else nullcontext():
            with CommCounter() as model_comm:
                model_sd = model.state_dict() if kind in KINDS else get_model_state_dict(model)
            with CommCounter() as optim_comm:
                optim_sd = (FSDP.optim_state_dict(model, optimizer) if kind in KINDS
                            else get_optimizer_state_dict(model, optimizer))
        state = {"model": model_sd, "optim": optim_sd}
        state_ms = (time.perf_counter() - start) * 1e3
        held = [None] * env.world_size
        dist.all_gather_object(held, tensor_bytes(state))
        start = time.perf_counter()
        _save(kind, state, out, env)
        save_ms = (time.perf_counter() - start) * 1e3
        del state, model_sd, optim_sd
        # Round trip: a fresh model (another init) and optimizer, one zero-gradient step so the
        # optimizer has state to fill, then load and compare with what was saved, bitwise.
        fresh, fresh_optimizer = build_fresh()
        for p in fresh.parameters():
            p.grad = torch.zeros_like(p)
        fresh_optimizer.step()
        fresh_optimizer.zero_grad(set_to_none=True)
        start = time.perf_counter()
        _load(kind, fresh, fresh_optimizer, out, env)
        load_ms = (time.perf_counter() - start) * 1e3
        got = _snapshot(fresh, fresh_optimizer)
        equal = torch.tensor(int(len(got) == len(reference) and all(map(torch.equal, got, reference))))
        dist.all_reduce(equal, op=dist.ReduceOp.MIN)
        files = list_files(out)
        rows.append({"state dict": kind, "state_dict ms": round(state_ms, 1),
                     "bytes held rank 0": held[0], "bytes held max other rank": max(held[1:], default=0),
                     "model gathered bytes": _moved(model_comm), "optim gathered bytes": _moved(optim_comm),
                     "save ms": round(save_ms, 1), "files": len(files),
                     "file bytes": sum(f["bytes"] for f in files), "load ms": round(load_ms, 1),
                     "round trip equal": bool(equal.item()), "who can load it": WHO_LOADS[kind]})
    env.print0("\nstate-dict types (model + AdamW state), measured:")
    env.print0(table([{k: v for k, v in r.items() if k != "who can load it"} for r in rows]))
    return {"rows": rows, "param_bytes": sum(4 * p.numel() for p in GPT(model.module.cfg).parameters())}
