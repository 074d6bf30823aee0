"""Lesson 7: memory — what fits, why, and how to make it fit.

Trains the course GPT once per variant and measures, per rank, what one step holds (PyTorch's
memory trackers, one step) next to what the planner predicted (``fsdp_course.theory.memory``,
the library behind ``python -m fsdp_course.plan``). Variants: the API (FSDP2 ``fully_shard`` or
classic ``FullyShardedDataParallel``), the strategy (or DDP), bf16 mixed precision, activation
checkpointing, CPU offload, and a per-rank memory limit that makes "does not fit" real.

    bash launch/lesson7.sh                                    # FSDP2 FULL_SHARD, 2 ranks
    bash launch/lesson7.sh \
        --variants "api=classic;mixed-precision=true;activation-checkpointing=full"
    bash launch/lesson7.sh --activation-checkpointing every-2 --seq-len 128
    NPROC=4 bash launch/lesson7.sh --d-model 256 --n-layers 8 --batch-size 4 \\
        --rank-memory-mib 96 --variants "strategy=DDP;strategy=FULL_SHARD"
    bash launch/lesson7.sh --cpu-offload params               # CPUOffloadPolicy (FSDP2)
    python -m fsdp_course.plan --model course-gpt-default --world-size 2   # the prediction only
"""

import functools
import gc
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch.distributed._composable import checkpoint
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointImpl,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import probes
import runs
from fsdp_course.config import TrainConfig, describe, parse_config, parse_variants
from fsdp_course.data import load_data
from fsdp_course.dist import distributed, mean_over_ranks
from fsdp_course.measure import CommCounter, MiB, state_bytes
from fsdp_course.model import GPT, Block, lm_loss
from fsdp_course.report import MetricLogger, write_metrics


@dataclass
class Config(TrainConfig):
    steps: int = field(default=3, metadata={"help": "optimizer steps (step 2 is measured)"})
    api: str = field(default="fsdp2", metadata={"choices": ("fsdp2", "classic"),
                     "help": "fsdp2: fully_shard; classic: FullyShardedDataParallel"})
    strategy: str = field(default="FULL_SHARD", metadata={
        "choices": ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "DDP"),
        "help": "what each rank keeps"})
    mixed_precision: bool = field(default=False, metadata={
        "help": "bf16 compute and all-gathers; fp32 master weights, gradients and Adam"})
    activation_checkpointing: str = field(default="none", metadata={
        "help": "none, full (every block), or every-K (blocks 0, K, 2K, ...)"})
    ac_order: str = field(default="right", metadata={"choices": ("right", "wrong"),
                          "help": "wrong: checkpoint and shard in the other order"})
    ac_reentrant: bool = field(default=False, metadata={
        "help": "the older reentrant checkpoint implementation (classic FSDP only)"})
    cpu_offload: str = field(default="none",
                             metadata={"choices": ("none", "params", "params-pinned"),
                             "help": "keep shards, gradients and the optimizer step on the CPU"})
    rank_memory_mib: float = field(default=0.0, metadata={
        "help": "each rank may grow by this much after warm-up (RLIMIT_AS); 0: no limit"})
    variants: tuple | None = field(default=None, metadata={
        "parse": parse_variants, "metavar": "'FLAG=V,FLAG=V;...'",
        "help": "several runs in one launch: 'api=classic;strategy=DDP,mixed-precision=true'"})


def shard(model, cfg, env):
    """Activation checkpointing and sharding, in the order each API needs."""
    chosen = runs.blocks_to_checkpoint(model, cfg.activation_checkpointing)
    is_chosen = lambda module: any(module is block for block in chosen)  # noqa: E731
    wrapper = functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.REENTRANT
                                if cfg.ac_reentrant else CheckpointImpl.NO_REENTRANT)
    if cfg.strategy == "DDP":
        apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrapper, check_fn=is_chosen)
        # Gradients as views into the all-reduce buckets: 4P less than DDP's default. Every rank
        # built the same weights from the same seed, so no initial broadcast (init_sync=False):
        # then a rank that runs out of memory does so outside any collective.
        return DDP(model, gradient_as_bucket_view=True, init_sync=False)
    if cfg.api == "fsdp2":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        options = dict(reshard_after_forward=cfg.strategy == "FULL_SHARD",
                       mp_policy=mp if cfg.mixed_precision else MixedPrecisionPolicy())
        if cfg.cpu_offload != "none":  # pinned memory needs an accelerator (see the notebook)
            pinned = cfg.cpu_offload == "params-pinned"
            options["offload_policy"] = CPUOffloadPolicy(pin_memory=pinned)
        if cfg.ac_order == "right":
            for block in chosen:
                checkpoint(block)  # FSDP2: checkpoint BEFORE fully_shard (torchtitan's order)
        for block in model.blocks:
            fully_shard(block, **options)
        fully_shard(model, **{**options, "reshard_after_forward": None})  # root: kept for backward
        if cfg.ac_order == "wrong":
            for block in chosen:
                checkpoint(block)
        return model
    from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    if cfg.ac_order == "wrong":  # checkpoint first: FSDP then wraps the block INSIDE the wrapper
        apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrapper, check_fn=is_chosen)
    model = FSDP(
        model,
        auto_wrap_policy=functools.partial(transformer_auto_wrap_policy,
                                           transformer_layer_cls={Block}),
        sharding_strategy=ShardingStrategy[cfg.strategy],
        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if cfg.mixed_precision else None,
        cpu_offload=CPUOffload(offload_params=cfg.cpu_offload != "none"),
        device_id=env.device,  # required on CPU too, else FSDP looks for a GPU
    )
    if cfg.ac_order == "right":  # classic: checkpoint AFTER wrapping, around each unit's block
        apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrapper, check_fn=is_chosen)
    return model


def train(cfg, env, data, announce: bool = True) -> dict:
    """Predict, build, train; measure step ``runs.TRACKED`` with the trackers."""
    label, prediction = runs.planned(cfg, env, data.vocab_size, announce)
    if env.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(env.device)
    result = {"label": label, "config": dict(cfg.__dict__), "prediction": prediction}
    with probes.address_space_limit(int(cfg.rank_memory_mib * MiB)) as base:
        try:
            # --- model: the same initial weights on every rank ---------------------------------
            torch.manual_seed(cfg.seed)
            model = GPT(cfg.model_config(data.vocab_size)).to(env.device)
            # --- shard ---------------------------------------------------------------------------
            model = shard(model, cfg, env)
            # --- optimizer: after sharding, so it holds the shards ----------------------------
            optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
            watch_buckets = cfg.strategy == "DDP" and not cfg.rank_memory_mib  # for the tracker
            buckets = probes.ddp_buckets(model) if watch_buckets else {}
            # --- loop ----------------------------------------------------------------------------
            logger = MetricLogger(env if announce else runs.quiet(env), cfg.log_every)
            for step in range(cfg.steps):
                x, y = data.batch(step, env.rank, env.world_size, cfg.batch_size, cfg.seq_len,
                                  env.device)
                tracked = step == runs.TRACKED and not cfg.rank_memory_mib  # limit: no instruments
                memory = probes.StepMemory(model, optimizer, runs.api_of(cfg), buckets.values(),
                                           enabled=tracked, vm_base=base)
                start, start_cpu = time.perf_counter(), time.process_time()
                with memory, CommCounter() if tracked else nullcontext() as comm:
                    loss = lm_loss(model(x), y)
                    memory.mark("forward")
                    loss.backward()
                    memory.mark("backward")
                    if tracked:
                        result["state"] = state_bytes(model, optimizer)  # gradients still held
                        result["devices"] = probes.tensor_devices(model, optimizer)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    memory.mark("step")
                ms = (time.perf_counter() - start) * 1e3
                cpu_ms = (time.process_time() - start_cpu) * 1e3  # this rank's own work
                if base is not None:  # under a limit: how far this rank's address space grew
                    result["vm_growth"] = max(result.get("vm_growth", 0), memory.vm_growth)
                if tracked:
                    result["measured"], result["collectives"] = memory.results(), comm.summary()
                logger.log(step, mean_over_ranks(loss), ms,
                           result.get("measured", {}).get("peak", 0) / MiB,
                           comm.total_bytes / MiB if tracked else 0.0, last=step == cfg.steps - 1,
                           cpu_ms=cpu_ms)
            result.update(runs.timing(logger.history), history=logger.history)
            if env.device.type == "cuda":  # the allocator's own count, on a GPU
                result["cuda_max_allocated"] = torch.cuda.max_memory_allocated(env.device)
        except (RuntimeError, MemoryError) as exc:
            if not runs.is_expected_failure(exc, cfg):
                raise
            result["error"] = runs.first_line(exc)  # the real message, one line
            env.print0(f"FAILED on rank 0: {result['error']}")
        finally:
            model = optimizer = loss = None  # free this variant before the next
            gc.collect()  # DDP and FSDP keep reference cycles (hooks): free them now
    return result


def main() -> None:
    cfg = parse_config(Config, __doc__)
    runs.prepare_allocator(cfg)  # before any thread starts (probes explains why)
    with distributed(seed=cfg.seed) as env:
        # --- setup ---------------------------------------------------------------------------
        variants = runs.expand(cfg, env.world_size)
        env.print0(f"lesson 7 | {env.world_size} ranks | {env.backend} on {env.device.type} | "
                   f"{describe(cfg)}")
        data = load_data(cfg.data, seed=cfg.seed)
        results = runs.run_all(variants, lambda v, announce=True: train(v, env, data, announce))
        # --- report ----------------------------------------------------------------------------
        outcomes = runs.print_report(env, results)
        write_metrics(cfg.metrics, "lesson7", env, cfg, results[-1].get("history", []),
                      {"runs": results, "outcomes": outcomes})


if __name__ == "__main__":
    main()
