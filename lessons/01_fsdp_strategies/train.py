"""Lesson 1: classic FSDP (FullyShardedDataParallel) and its sharding strategies.

Trains the course's small GPT with every transformer block wrapped as its own FSDP unit, and
measures what each strategy costs per rank: bytes of parameters, gradients, optimizer state,
all-gathered parameters and activations, and the bytes of each collective per step, printed
next to the theory (``fsdp_course.theory``).

    bash launch/lesson1.sh                                  # FULL_SHARD on 2 ranks
    bash launch/lesson1.sh --strategy SHARD_GRAD_OP --metrics runs/sgo.json
    bash launch/lesson1.sh --strategy FULL_SHARD,SHARD_GRAD_OP,NO_SHARD   # one after another
    NPROC=4 bash launch/lesson1.sh --strategy HYBRID_SHARD --replicas 2   # a 2 x 2 mesh
    torchrun --standalone --nproc-per-node=2 lessons/01_fsdp_strategies/train.py   # the same
"""

import functools
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

from fsdp_course import theory
from fsdp_course.config import TrainConfig, describe, parse_config
from fsdp_course.data import load_data
from fsdp_course.dist import CourseError, distributed, mean_over_ranks
from fsdp_course.measure import (MiB, CommCounter, GatheredParamTracker, activation_bytes,
                                 state_bytes)
from fsdp_course.model import GPT, Block, lm_loss
from fsdp_course.report import MetricLogger, table, write_metrics


@dataclass
class Config(TrainConfig):
    strategy: str = field(default="FULL_SHARD", metadata={
        "help": f"one of {', '.join(theory.STRATEGIES)}, or several separated by commas"})
    replicas: int = field(default=2, metadata={"help": "HYBRID_SHARD: replica groups (mesh rows)"})
    mixed_precision: bool = field(default=False, metadata={
        "help": "compute and communicate in bf16; the sharded master weights stay fp32"})


def train(cfg: Config, strategy: str, env, data) -> dict:
    """Wrap a fresh model with ``strategy``, train it, return what was measured."""
    mesh = None
    if strategy == "HYBRID_SHARD":
        # Without an explicit mesh FSDP sizes a "node" by the local device count, which is 1 on
        # CPU, and silently never syncs gradients across replicas (CPU_NOTES, trap 3).
        mesh = init_device_mesh(env.device.type, (cfg.replicas, env.world_size // cfg.replicas),
                                mesh_dim_names=("replicate", "shard"))

    # --- model: the same initial weights on every rank (same seed on every rank) ----------
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model_config(data.vocab_size))
    unit_numels = theory.fsdp_unit_numels(model, Block)  # root first, then one per block

    # --- shard: every Block becomes its own FSDP unit; the rest goes to the root unit -------
    model = FSDP(
        model,
        auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block}),
        sharding_strategy=ShardingStrategy[strategy],
        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
        if cfg.mixed_precision else None,
        device_id=env.device,  # required on CPU too, else FSDP looks for a GPU
        device_mesh=mesh,
    )

    # --- optimizer: built after wrapping, so it holds the sharded flat parameters -----------
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)

    # --- loop ---------------------------------------------------------------------------------
    env.print0(f"\n== {strategy}{' + bf16 mixed precision' if cfg.mixed_precision else ''} ==")
    logger = MetricLogger(env, cfg.log_every)
    for step in range(cfg.steps):
        x, y = data.batch(step, env.rank, env.world_size, cfg.batch_size, cfg.seq_len, env.device)
        start = time.perf_counter()
        with CommCounter() as comm, GatheredParamTracker(model) as gathered:
            with activation_bytes(model) as activations:
                loss = lm_loss(model(x), y)
            loss.backward()
            measured = state_bytes(model, optimizer)  # before zero_grad: gradients still held
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        ms = (time.perf_counter() - start) * 1e3
        peak = sum(measured.values()) + gathered.peak + activations["bytes"]
        logger.log(step, mean_over_ranks(loss), ms, peak / MiB, comm.total_bytes / MiB,
                   last=step == cfg.steps - 1)

    # --- report: measured next to theory --------------------------------------------------
    wire_bytes = 2 if cfg.mixed_precision else 4
    measured.update(gathered=gathered.peak, activations=activations["bytes"])
    expected = theory.model_state_bytes(unit_numels, env.world_size, strategy, cfg.replicas)
    expected["gathered"] = theory.gathered_peak_bytes(unit_numels, env.world_size, strategy,
                                                      cfg.replicas, param_bytes=wire_bytes)
    comm_expected = theory.collective_bytes(unit_numels, env.world_size, strategy, cfg.replicas,
                                            param_bytes=wire_bytes, reduce_bytes=wire_bytes)
    per_rank = [None] * env.world_size
    dist.all_gather_object(per_rank, measured)  # each rank's own bytes differ by padding only
    param_bytes = 4 * sum(unit_numels)
    env.print0("\nper-rank bytes, rank 0 (theory: fsdp_course.theory):")
    env.print0(table([{"category": k, "measured": v, "theory": expected.get(k, "-"),
                       "MiB": round(v / MiB, 3)} for k, v in measured.items()]))
    env.print0("\ncollectives in the last step (payload bytes):")
    env.print0(table([{"collective": k, "calls": v["calls"], "bytes": v["bytes"],
                       "theory": comm_expected.get(k, 0),
                       "x param bytes": round(v["bytes"] / param_bytes, 3)}
                      for k, v in comm.summary().items()] or [{"collective": "(none)"}]))
    return {
        "strategy": strategy, "mixed_precision": cfg.mixed_precision,
        "num_params": sum(unit_numels), "unit_numels": unit_numels,
        "bytes": measured, "bytes_theory": expected, "bytes_per_rank": per_rank,
        "collectives": comm.summary(), "collectives_theory": comm_expected,
        "ms_per_step": sorted(row["ms"] for row in logger.history)[len(logger.history) // 2],
        "loss_first": logger.history[0]["loss"], "loss_last": logger.history[-1]["loss"],
        "history": logger.history,
    }


def main() -> None:
    cfg = parse_config(Config, __doc__)
    with distributed(seed=cfg.seed) as env:
        # --- setup ---------------------------------------------------------------------------
        strategies = [s.strip().upper() for s in cfg.strategy.split(",") if s.strip()]
        for strategy in strategies:
            if strategy not in theory.STRATEGIES:
                raise CourseError(f"--strategy {strategy}: choose from {', '.join(theory.STRATEGIES)}")
            if strategy == "HYBRID_SHARD" and (env.world_size % cfg.replicas or env.world_size == cfg.replicas):
                raise CourseError(f"HYBRID_SHARD: {env.world_size} ranks do not split into "
                                  f"--replicas {cfg.replicas} groups of 2 or more (try NPROC=4)")
        env.print0(f"lesson 1 | {env.world_size} ranks | {env.backend} on {env.device.type} | {describe(cfg)}")
        data = load_data(cfg.data, seed=cfg.seed)

        runs = [train(cfg, strategy, env, data) for strategy in strategies]

        if env.device.type == "cuda":
            runs[-1]["cuda_max_allocated"] = torch.cuda.max_memory_allocated(env.device)
        write_metrics(cfg.metrics, "lesson1", env, cfg, runs[-1]["history"], {"runs": runs})


if __name__ == "__main__":
    main()
