"""Lesson 1's runs (what the lesson is not about): the --strategy list and the runs it and
--variants plan, the optimizer's parameter groups, where each rank's shards lie, the theory's
bytes, the step-0 gradient norms, and the tables rank 0 prints."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

from fsdp_course import theory
from fsdp_course.config import list_flag, plan_runs
from fsdp_course.dist import CourseError
from fsdp_course.measure import MiB, fsdp_flat_params
from fsdp_course.model import lm_loss
from fsdp_course.report import table

WEIGHT_DECAY = 0.01  # AdamW's default, kept for the weight matrices

# --strategy FULL_SHARD,no_shard -> Strategies(("FULL_SHARD", "NO_SHARD")), checked where the
# config is read: a name that is no strategy is argparse's one line (exit 2).
Strategies = list_flag("Strategies", theory.STRATEGIES, fold=str.upper)


def plan(cfg, world_size: int) -> list[tuple]:
    """(config, strategy, label, variant) of every run, in order: each --strategy on the command
    line's config (variant None), then the same for each ``--variants`` entry (the command
    line's config with the entry's flags changed, each typed like its flag). ``--replicas``
    shapes HYBRID_SHARD's mesh; without a mesh FSDP picks the groups itself. All checked before
    anything runs: a CourseError, one line."""
    runs = []
    for config, variant in plan_runs(cfg):
        for strategy in config.strategy:
            if strategy == "HYBRID_SHARD" and config.mesh and (
                    world_size % config.replicas or world_size == config.replicas):
                raise CourseError(f"HYBRID_SHARD: {world_size} ranks do not split into "
                                  f"--replicas {config.replicas} groups of 2 or more (try NPROC=4)")
            runs.append((config, strategy, run_label(config, strategy), variant))
    return runs


def run_label(cfg, strategy: str) -> str:
    """``FULL_SHARD + bf16 mixed precision``: the strategy and the options the run changes."""
    options = [("bf16 mixed precision", cfg.mixed_precision),
               ("use_orig_params", cfg.use_orig_params),
               ("sync_module_states", cfg.sync_module_states),
               ("no device mesh", strategy == "HYBRID_SHARD" and not cfg.mesh)]
    return " + ".join([strategy] + [name for name, on in options if on])


def refused_run(env, strategy: str, label: str, exc: Exception) -> dict:
    """A run torch refused to wrap (sync_module_states on CPU ranks): its message, no training."""
    message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0]}"
    env.print0(f"\n== {label} ==\ntorch refused to wrap the model: {message}")
    return {"strategy": strategy, "label": label, "sync_module_states": True, "refused": message,
            "history": []}


def decay_groups(model) -> list[dict]:
    """AdamW parameter groups, the usual GPT recipe: weight decay on weight matrices, none on
    biases and LayerNorms, chosen *by name*. With ``use_orig_params=True`` the names are the
    model's own (``...blocks.0...attn.qkv.bias``); with flat parameters every name ends in
    ``_flat_param``, one tensor mixes weights, biases and norms, and all land in one group."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if name.endswith("bias") or ".ln" in name else decay).append(param)
    groups = [{"params": decay, "weight_decay": WEIGHT_DECAY},
              {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def describe_parameters(model, optimizer) -> dict:
    """What the optimizer sees: parameter names (a few) and count, and its groups."""
    names = [name for name, _ in model.named_parameters()]
    return {"count": len(names), "first_names": names[:3],
            "groups": [{"params": len(g["params"]), "weight_decay": g["weight_decay"]}
                       for g in optimizer.param_groups]}


def shard_layout(model, world_size: int) -> list[list[dict]]:
    """For every rank, for every unit (root first): elements stored and how many of them are
    padding FSDP appended to even out the shards (``_shard_numel_padded``)."""
    mine = [{"stored": fp.numel(), "padding": fp._shard_numel_padded}
            for fp in fsdp_flat_params(model)]
    everyone = [None] * world_size
    dist.all_gather_object(everyone, mine)
    return everyone


def replica_spread(model, what: str) -> float:
    """HYBRID_SHARD: the largest difference between rank 0's flat shards (``what``: their
    ``"grad"`` or the weights) and those of the ranks meant to hold a copy of the same shard,
    FSDP's replica group (``_inter_node_pg``). 0 when the replicas are kept in sync."""
    flats = fsdp_flat_params(model)
    mine = torch.cat([(fp.grad if what == "grad" else fp).detach().reshape(-1) for fp in flats])
    group = model._inter_node_pg
    copies = [torch.empty_like(mine) for _ in range(group.size())]
    dist.all_gather(copies, mine, group=group)
    return max((copy - copies[0]).abs().max().item() for copy in copies)


def hybrid_groups(model, ran: str, grad_spread: float) -> dict:
    """What FSDP built for HYBRID_SHARD: its shard and replica groups, the strategy it runs, and
    how far the replicas' gradients (step 0) and weights (now) are apart."""
    return {"shard_group": model.process_group.size(), "replica_group": model._inter_node_pg.size(),
            "ran_as": ran, "grad_spread": grad_spread,
            "weight_spread": replica_spread(model, "weights")}


def print_report(env, watched: int, measured: dict, expected: dict, comm: dict, comm_expected: dict,
                 param_bytes: int, norms: dict, factors: dict, groups: dict | None = None) -> None:
    """Rank 0's tables: bytes per category and per collective, measured next to the theory."""
    env.print0(f"\nper-rank bytes in step {watched}, rank 0 (theory: fsdp_course.theory):")
    env.print0(table([{"category": k, "measured": v, "theory": expected.get(k, "-"),
                       "MiB": round(v / MiB, 3)} for k, v in measured.items()]))
    env.print0(f"\ncollectives in step {watched} (payload bytes):")
    env.print0(table([{"collective": k, "calls": v["calls"], "bytes": v["bytes"],
                       "theory": comm_expected.get(k, 0),
                       "x param bytes": round(v["bytes"] / param_bytes, 3)}
                      for k, v in comm.items()] or [{"collective": "(none)"}]))
    env.print0(f"\ngradients averaged: divided by {factors['pre']:g} before the reduction and by "
               f"{factors['post']:g} after it")
    env.print0("gradient norm at step 0: "
               "torch.nn.utils.clip_grad_norm_ per rank "
               f"{[round(n, 4) for n in norms['torch_nn_utils_per_rank']]}"
               f" | FSDP.clip_grad_norm_ {norms['fsdp']:.4f} | one process, global batch "
               f"{norms['single_process']:.4f}")
    if groups:
        env.print0(f"HYBRID_SHARD's groups: shard group {groups['shard_group']} rank(s), replica "
                   "group "
                   f"{groups['replica_group']}; FSDP runs {groups['ran_as']}; the replicas differ "
                   "by up "
                   f"to {groups['grad_spread']:.3g} in a gradient (step 0) and "
                   f"{groups['weight_spread']:.3g} "
                   "in a weight (last step)")


def note_no_shard(env, planned: list[tuple]) -> None:
    """torch 2.13 warns that NO_SHARD is deprecated once per FSDP unit: say it once instead."""
    if any(strategy == "NO_SHARD" for _, strategy, _, _ in planned):
        warnings.filterwarnings("ignore",
                                message="The `NO_SHARD` sharding strategy is deprecated")
        env.print0("note: torch 2.13 deprecates NO_SHARD (FutureWarning: use "
                   "DistributedDataParallel)")


def theory_bytes(cfg, unit_param_numels: list, env, ran: str) -> tuple[dict, dict]:
    """What ``fsdp_course.theory`` expects for the strategy FSDP ran: this rank's bytes per
    category (with the peak of all-gathered parameters) and the bytes of each collective."""
    wire_bytes = 2 if cfg.mixed_precision else 4
    flat_numels = theory.sharding.unit_flat_numels(unit_param_numels, env.world_size, ran,
                                                   cfg.replicas, cfg.use_orig_params, wire_bytes)
    expected = theory.sharding.rank_state_bytes(unit_param_numels, env.world_size, ran,
                                                cfg.replicas, env.rank, cfg.use_orig_params,
                                                compute_bytes=wire_bytes)
    expected["gathered"] = theory.gathered_peak_bytes(flat_numels, env.world_size, ran,
                                                      cfg.replicas, param_bytes=wire_bytes)
    comm_expected = theory.collective_bytes(flat_numels, env.world_size, ran, cfg.replicas,
                                            param_bytes=wire_bytes, reduce_bytes=wire_bytes)
    return expected, comm_expected


def grad_norms(model, reference, data, cfg, env) -> dict:
    """The step-0 gradient norm three ways, measured, nothing clipped (``max_norm=inf`` returns
    the norm and scales every gradient by 1): ``torch.nn.utils.clip_grad_norm_`` sees only this
    rank's flat shards; ``FSDP.clip_grad_norm_`` all-reduces the squared shard norms into the
    global one; one process computing the whole global batch's gradient says which is right."""
    inf = float("inf")
    local = torch.nn.utils.clip_grad_norm_(model.parameters(), inf).item()
    fsdp = model.clip_grad_norm_(inf).item()  # a collective: every rank calls it
    x, y = data.batch(0, 0, 1, cfg.batch_size * env.world_size, cfg.seq_len)
    lm_loss(reference(x), y).backward()
    single = torch.nn.utils.get_total_norm([p.grad for p in reference.parameters()]).item()
    per_rank = [None] * env.world_size
    dist.all_gather_object(per_rank, local)
    return {"torch_nn_utils_per_rank": per_rank, "fsdp": fsdp, "single_process": single}
