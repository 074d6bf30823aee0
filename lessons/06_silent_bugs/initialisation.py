"""Part A: parameters initialised differently on each rank.

Every variant builds the course GPT, wraps it, trains it on the same data, and is compared with
a single-process run on the global batch (the reference): its parameters right after wrapping,
its losses, its parameters at the end.
"""

from __future__ import annotations

import functools
import itertools
import time

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from torch.nn.parallel import DistributedDataParallel as DDP

from detect import compare_across_ranks, full_state, max_diff, model_states, slice_origins
from fsdp_course.dist import mean_over_ranks
from fsdp_course.model import GPT, Block, lm_loss

INIT_VARIANTS = ("per-rank-seed", "ddp", "same-seed", "broadcast", "sync-module-states",
                 "fsdp2-meta", "load-rank0")
BUGS = ("per-rank-seed", "fsdp2-meta")
BLOCK_POLICY = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})



def initialised(model, seed: int):
    """Seed, then initialise: the one recipe every variant uses (FSDP2's meta path can only
    initialise after sharding, so the others do it after building too, with the same calls)."""
    torch.manual_seed(seed)
    model.init_weights()
    return model


def build(variant: str, cfg, env, model_cfg, reference_init: dict) -> tuple[object, dict]:
    """The model of ``variant``, wrapped, and what was found on the way."""
    found = {}
    if variant in ("fsdp2-meta", "load-rank0"):
        # --- FSDP2: shapes on the meta device, shard, then allocate and fill the shards ------
        with torch.device("meta"):
            model = GPT(model_cfg)
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        model.to_empty(device=env.device)
        initialised(model, cfg.seed)  # the same seed on every rank: draws into each rank's shard
        if variant == "load-rank0":  # rank 0 holds the full weights (a checkpoint); the rest {}
            # A copy: the call replaces the dict's values with this rank's DTensor shards.
            set_model_state_dict(model, dict(reference_init) if env.rank == 0 else {},
                                 options=StateDictOptions(
                full_state_dict=True, broadcast_from_rank0=True))
        return model, found

    # --- model: full weights on every rank, seeded per variant ---------------------------------
    model = initialised(GPT(model_cfg).to(env.device), cfg.seed if variant == "same-seed"
                        else cfg.seed + env.rank)
    found["before_wrap"] = compare_across_ranks(model_states(model))  # the cheap detector
    if variant == "broadcast":
        broadcast_from_rank0(model)
    if variant == "sync-module-states":
        try:  # FSDP broadcasts rank 0's parameters and buffers itself ... on GPUs
            return FSDP(model, auto_wrap_policy=BLOCK_POLICY, device_id=env.device,
                        sync_module_states=True), found
        except ValueError as exc:  # CPU ranks: refused; do what it does, then wrap
            found["error"] = f"{type(exc).__name__}: {exc}"
            broadcast_from_rank0(model)
    if variant == "ddp":
        # DDP broadcasts rank 0's parameters and buffers in its constructor: the bug is hidden.
        model = DDP(model)
        found["after_ddp"] = compare_across_ranks(model_states(model.module))
        return model, found
    # --- shard: classic FSDP, one unit per Block (lesson 1) -------------------------------------
    return FSDP(model, auto_wrap_policy=BLOCK_POLICY, device_id=env.device), found


@torch.no_grad()
def broadcast_from_rank0(model) -> None:
    """What sync_module_states=True does: every parameter and buffer takes rank 0's values."""
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        dist.broadcast(tensor, src=0)


def where_from(full: dict, cfg, env, model_cfg) -> list[dict]:
    """Rank 0: which slices of each gathered parameter equal which rank's own init."""
    inits = []
    for rank in range(env.world_size):
        inits.append(initialised(GPT(model_cfg), cfg.seed + rank).state_dict())
    rows = []
    for name, tensor in full.items():
        if tensor.is_floating_point():
            runs = slice_origins(tensor, [init[name] for init in inits])
            rows.append({"name": name, "numel": tensor.numel(),
                         "runs": [{"from": who, "start": a, "end": b} for who, a, b in runs]})
    return rows


def equal_to_reference(full: dict, reference_init: dict) -> dict:
    """Of the randomly initialised tensors (those that are not constant), how many elements
    equal the single-process init, and in which tensors."""
    random = [k for k, v in reference_init.items() if v.is_floating_point() and v.numel() > 1
              and v.std() > 0]
    equal = {k: int((full[k] == reference_init[k]).sum()) for k in random}
    return {"elements": sum(reference_init[k].numel() for k in random),
            "equal": sum(equal.values()),
            "tensors": {k: [n, reference_init[k].numel()] for k, n in equal.items() if n}}


def reference(cfg, env, data, model_cfg) -> dict:
    """One process, the global batch, the same seed: what every variant should equal."""
    model = initialised(GPT(model_cfg).to(env.device), cfg.seed)
    init = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    losses = []
    for step in range(cfg.steps):
        x, y = data.batch(step, 0, 1, cfg.batch_size * env.world_size, cfg.seq_len, env.device)
        loss = lm_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return {"init": init, "losses": losses, "final": model.state_dict()}


def run(variant: str, cfg, env, data, model_cfg, ref: dict) -> dict:
    start = time.perf_counter()
    model, found = build(variant, cfg, env, model_cfg, ref["init"])
    initial = full_state(model)
    # The same check after wrapping: all-gathered parameters are identical on every rank.
    found["after_wrap"] = compare_across_ranks(sorted(initial.items()))
    # --- optimizer and loop: the same for every variant -----------------------------------------
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    losses = []
    for step in range(cfg.steps):
        x, y = data.batch(step, env.rank, env.world_size, cfg.batch_size, cfg.seq_len, env.device)
        loss = lm_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(mean_over_ranks(loss))
    final = full_state(model)
    result = {"variant": variant, "bug": variant in BUGS, **found, "losses": losses,
              "seconds": time.perf_counter() - start}
    if env.rank == 0:  # compare with the reference (rank 0 alone holds it)
        result.update(init_diff=max_diff(initial, ref["init"]),
                      final_diff=max_diff(final, ref["final"]),
                      loss_diff=max(abs(a - b) for a, b in zip(losses, ref["losses"])))
        if variant == "per-rank-seed":
            result["origins"] = where_from(initial, cfg, env, model_cfg)
        if variant == "fsdp2-meta":
            result["equal_to_reference"] = equal_to_reference(initial, ref["init"])
    return result

