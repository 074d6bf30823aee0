"""Lesson 4's measured table of state-dict types (imported by train.py for ``--demo types``).

Classic FSDP's FULL_STATE_DICT (rank0_only), SHARDED_STATE_DICT and LOCAL_STATE_DICT, and DCP's
``get_state_dict`` on classic FSDP, FSDP2 and DDP. Per row: the bytes the state dict holds on
each rank, the bytes all-gathered to build it, the files written, and a round trip into a fresh
model (another initialisation), compared bitwise with the trained one.

Two things the table shows that the APIs' names do not:
- classic FSDP's SHARDED_STATE_DICT (which ``get_state_dict`` uses for a classic model) is not
  free: its pre-hook all-gathers each unit's flat parameter, then cuts every original parameter
  into per-rank chunks (``_sharded_pre_state_dict_hook`` / ``_sharded_post_state_dict_hook`` in
  torch/distributed/fsdp/_state_dict_utils.py). FSDP2's parameters are per-parameter shards
  already (DTensors): its state dict is those shards, nothing is gathered.
- DDP's state dict holds full tensors on every rank; ``dcp.save`` writes each of them once
  (its planner drops the duplicates: torch/distributed/checkpoint/_dedup_save_plans.py).
"""

import time
import warnings
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    FullOptimStateDictConfig,
    FullStateDictConfig,
    LocalOptimStateDictConfig,
    LocalStateDictConfig,
    ShardedOptimStateDictConfig,
    ShardedStateDictConfig,
    StateDictType,
    fully_shard,
)
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.nn.parallel import DistributedDataParallel as DDP

from fsdp_course.checkpoint import compare_fingerprints, fingerprint, list_files, tensor_bytes
from fsdp_course.measure import CommCounter
from fsdp_course.model import GPT
from fsdp_course.report import table

CLASSIC = {
    # rank0_only: only rank 0 keeps the gathered copy. offload_to_cpu=False: on CPU ranks the
    # tensors are in CPU memory already, and classic FSDP's offload path fails there
    # (`bash launch/lesson4.sh --bug offload-cpu` runs it). On GPUs, offload_to_cpu=True.
    "FULL_STATE_DICT": (StateDictType.FULL_STATE_DICT,
                        FullStateDictConfig(rank0_only=True, offload_to_cpu=False),
                        FullOptimStateDictConfig(rank0_only=True, offload_to_cpu=False)),
    "SHARDED_STATE_DICT": (StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(),
                           ShardedOptimStateDictConfig()),
    "LOCAL_STATE_DICT": (StateDictType.LOCAL_STATE_DICT, LocalStateDictConfig(),
                         LocalOptimStateDictConfig()),
}
FULL_LOAD = FullStateDictConfig(rank0_only=False, offload_to_cpu=False)
ROWS = (("classic", "FULL_STATE_DICT"), ("classic", "SHARDED_STATE_DICT"),
        ("classic", "LOCAL_STATE_DICT"),
        ("classic", "get_state_dict"), ("FSDP2", "get_state_dict"), ("DDP", "get_state_dict"))


def fresh_dir(path: Path, env) -> Path:
    if env.is_rank0:
        import shutil

        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
    dist.barrier()
    return path


def with_adam_state(model, optimizer):
    """One zero-gradient step, so a fresh optimizer has the Adam state a load fills in place."""
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def build_as(wrapper: str, model_cfg, lr: float, seed: int, device: torch.device):
    """The course GPT wrapped as ``wrapper`` (FSDP2: fully_shard each block, then the root)."""
    torch.manual_seed(seed)
    model = GPT(model_cfg).to(device)
    if wrapper == "FSDP2":
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        for block in model.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
    else:
        model = DDP(model, device_ids=[device] if device.type == "cuda" else None)
    return with_adam_state(model, torch.optim.AdamW(model.parameters(), lr=lr))


@contextmanager
def _state_dict_type(model, kind: str, record: list, loading: bool = False):
    """``with FSDP.state_dict_type(...)`` for a classic kind. torch 2.13 raises a FutureWarning
    on every entry (use get_state_dict / set_state_dict instead): the first is kept in
    ``record`` for the report; the script's setup silences the rest."""
    if kind not in CLASSIC:
        yield
        return
    state_type, model_config, optim_config = CLASSIC[kind]
    if loading and kind == "FULL_STATE_DICT":
        model_config = FULL_LOAD  # every rank loads the whole model
    with ExitStack() as stack:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            stack.enter_context(FSDP.state_dict_type(model, state_type, model_config, optim_config))
        if caught and not record:
            record.append(f"{caught[0].category.__name__}: {caught[0].message}")
        yield


def _gathered(comm) -> int:
    """Bytes all-gathered or broadcast: what had to travel to build the state dict."""
    return comm.bytes.get("all_gather", 0) + comm.bytes.get("broadcast", 0)


def _save(kind: str, state, out: Path, env):
    if kind == "FULL_STATE_DICT":
        if env.is_rank0:  # rank0_only: the others hold empty dicts
            torch.save(state, out / "full.pt")
    elif kind == "LOCAL_STATE_DICT":
        torch.save(state, out / f"local_rank{env.rank}.pt")
    else:  # ShardedTensors, DTensors or (DDP) full tensors: DCP writes them, and a .metadata index
        dcp.save(state, checkpoint_id=out)
    dist.barrier()


def _load(kind: str, model, optimizer, out: Path, env, record: list):
    if kind == "get_state_dict":
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=out)  # in place, into this model's own layout
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        return
    if kind == "FULL_STATE_DICT":
        state = torch.load(out / "full.pt", weights_only=True)
        if not env.is_rank0:
            state["optim"] = {}  # rank0_only=True: the optimizer state is scattered from rank 0
    elif kind == "LOCAL_STATE_DICT":
        state = torch.load(out / f"local_rank{env.rank}.pt", weights_only=False)  # ShardedTensors
    with _state_dict_type(model, kind, record, loading=True):
        if kind == "SHARDED_STATE_DICT":
            state = {"model": model.state_dict(), "optim": FSDP.optim_state_dict(model, optimizer)}
            dcp.load(state, checkpoint_id=out)  # in place, into this run's shards
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(FSDP.optim_state_dict_to_load(model, optimizer, state["optim"]))


def _measure(wrapper, kind, model, optimizer, out, env, build_fresh, reference, record) -> dict:
    start = time.perf_counter()
    with _state_dict_type(model, kind, record):
        with CommCounter() as model_comm:
            model_sd = model.state_dict() if kind in CLASSIC else get_model_state_dict(model)
        with CommCounter() as optim_comm:
            optim_sd = (FSDP.optim_state_dict(model, optimizer) if kind in CLASSIC
                        else get_optimizer_state_dict(model, optimizer))
    state = {"model": model_sd, "optim": optim_sd}
    held = [None] * env.world_size
    dist.all_gather_object(held, tensor_bytes(state))
    _save(kind, state, out, env)
    save_ms = (time.perf_counter() - start) * 1e3
    del state, model_sd, optim_sd
    # another init: the load must overwrite everything
    fresh, fresh_optimizer = build_fresh(wrapper)
    start = time.perf_counter()
    _load(kind, fresh, fresh_optimizer, out, env, record)
    load_ms = (time.perf_counter() - start) * 1e3
    files = list_files(out)
    return {"state dict": f"{wrapper} {kind}", "held rank 0": held[0],
            "held max other": max(held[1:], default=0),
            "held all ranks": sum(held), "model gathered": _gathered(model_comm),
            "optim gathered": _gathered(optim_comm), "files": len(files),
            "file bytes": sum(f["bytes"] for f in files),
            "of which .metadata": sum(f["bytes"] for f in files if f["file"] == ".metadata"),
            "save ms": round(save_ms, 1),
            "load ms": round(load_ms, 1),
            "round trip equal": compare_fingerprints(reference,
                                                     fingerprint(fresh, fresh_optimizer))["equal"]}


def compare_types(model, optimizer, env, out_dir, build_classic) -> dict:
    """Every row of ROWS on the trained classic model. The FSDP2 and DDP rows first load the
    classic model's DCP checkpoint (written by the row before them) into their own layout."""
    out_dir = fresh_dir(Path(out_dir), env)
    model_cfg, lr = model.module.cfg, optimizer.param_groups[0]["lr"]
    reference = fingerprint(model, optimizer)

    def build_fresh(wrapper, seed=1234):
        if wrapper == "classic":
            return with_adam_state(*build_classic())
        return build_as(wrapper, model_cfg, lr, seed, env.device)

    rows, record, from_classic = [], [], {}
    for wrapper, kind in ROWS:
        source, source_optimizer = model, optimizer
        if wrapper != "classic":
            source, source_optimizer = build_fresh(wrapper, seed=99)
            _load("get_state_dict", source, source_optimizer, out_dir / "classic_get_state_dict",
                  env, record)
            from_classic[wrapper] = compare_fingerprints(reference,
                                                         fingerprint(source,
                                                                     source_optimizer))["equal"]
        out = fresh_dir(out_dir / f"{wrapper}_{kind}", env)
        rows.append(_measure(wrapper, kind, source, source_optimizer, out, env, build_fresh,
                             reference, record))
    env.print0("\nstate-dict types (model + AdamW state), measured:")
    env.print0(table(rows))
    env.print0("the classic model's DCP checkpoint loaded into FSDP2 and DDP, bitwise equal: "
               f"{from_classic}")
    env.print0("FSDP.state_dict_type warned (once shown, then silenced): "
               f"{record[0] if record else 'nothing'}")
    return {"rows": rows, "from_classic": from_classic, "warning": record[0] if record else None,
            "param_bytes": sum(4 * p.numel() for p in GPT(model_cfg).parameters()),
            "param_tensors": len(list(GPT(model_cfg).parameters()))}
