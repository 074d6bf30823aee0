"""Lesson 5: FSDP2 (``fully_shard``): DTensor parameters, its options, and moving lesson 1 to it.

Builds the course GPT on the meta device, calls ``fully_shard`` on every block and then on the
root, allocates and initialises the shards, and trains. Measured per variant: per-rank memory by
category (FSDPMemTracker, a running max per category), bytes per collective, time per step; the
DTensor layout of every parameter; and checks that catch the lesson's pitfalls.

    bash launch/lesson5.sh                                         # fully_shard on 2 ranks
    bash launch/lesson5.sh --reshard-after-forward false --mixed-precision --prefetch 2
    bash launch/lesson5.sh --variants "api=classic;reshard-after-forward=false;cpu-offload=true"
    bash launch/lesson5.sh --bug meta-buffers        # the causal mask left uninitialised
    bash launch/lesson5.sh --bug optimizer-first     # optimizer built before fully_shard
    bash launch/lesson5.sh --compile                 # compile each block, then fully_shard
    bash launch/lesson5.sh --shard-module solutions/lesson5_shard.py   # your shard(model, mesh)
    NPROC=3 bash launch/lesson5.sh                   # uneven shards: look at the local shapes
"""

import copy
import functools
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

from fsdp_course import fsdp2
from fsdp_course.config import TrainConfig, describe, parse_config
from fsdp_course.data import load_data
from fsdp_course.dist import CourseError, distributed, mean_over_ranks
from fsdp_course.measure import MiB, CommCounter, local_tensor
from fsdp_course.model import GPT, Block, lm_loss
from fsdp_course.report import MetricLogger, table, write_metrics

BUGS = ("meta-buffers", "optimizer-first", "compile-whole")
# init_weights() draws random numbers into DTensor shards (replaced below by the reference's
# weights), and the model returns logits that are a view: both harmless here.
warnings.filterwarnings("ignore", message="DTensor random operators")
warnings.filterwarnings("ignore", message=".*returned a view tensor")


@dataclass
class Config(TrainConfig):
    api: str = field(default="fsdp2", metadata={"choices": ("fsdp2", "classic"),
                     "help": "fsdp2: fully_shard; classic: lesson 1's FullyShardedDataParallel"})
    reshard_after_forward: str = field(default="true", metadata={
        "help": "true (ZeRO-3), false (ZeRO-2: keep gathered until backward), or a group size"})
    mixed_precision: bool = field(default=False, metadata={
        "help": "bf16 parameters in forward/backward, fp32 gradient reduction"})
    prefetch: int = field(default=0, metadata={
        "help": "explicit prefetching: each block all-gathers the next N blocks (0: implicit)"})
    grad_accum: int = field(default=1, metadata={
        "help": "micro-batches per step; gradients sync on the last one only"})
    cpu_offload: bool = field(default=False, metadata={"help": "CPUOffloadPolicy: shards on CPU"})
    replicas: int = field(default=1, metadata={
        "help": "HSDP: a 2-D mesh (replicas x ranks/replicas): shard within a row, replicate across"})
    compile: bool = field(default=False, metadata={"help": "torch.compile each block, then shard"})
    compile_backend: str = field(default="inductor", metadata={
        "help": "torch.compile backend (inductor generates C++ on CPU: slow to compile)"})
    bug: str | None = field(default=None, metadata={"choices": BUGS, "help": "reproduce a pitfall"})
    shard_module: str | None = field(default=None, metadata={
        "help": "a .py file defining shard(model, mesh), called instead of the fully_shard calls"})
    variants: str | None = field(default=None, metadata={
        "help": "several runs in one launch: 'api=classic;prefetch=2,mixed-precision=true'"})


def build_fsdp2(cfg, env, mesh, model_cfg, shard_fn=None):
    """Meta-device build -> fully_shard (each block, then the root) -> to_empty -> init."""
    # --- model: on the meta device: shapes only, no memory, no values yet ----------------------
    with torch.device("meta"):
        model = GPT(model_cfg)
    early_optimizer = None
    if cfg.bug == "optimizer-first":  # BUG: holds the parameters fully_shard is about to replace
        early_optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    if cfg.compile and cfg.bug == "compile-whole":
        model = torch.compile(model, backend=cfg.compile_backend)  # BUG: a wrapper, before sharding
    elif cfg.compile:
        # Each block in place, before sharding (torchtitan's order): module.compile() keeps the
        # Block class and the parameter names, so fully_shard, prefetch lists and checkpoints
        # see the same model; identical blocks reuse one compiled graph.
        for block in model.blocks:
            block.compile(backend=cfg.compile_backend)

    if cfg.replicas > 1:  # HSDP (classic HYBRID_SHARD): placements become (Replicate(), Shard(0))
        mesh = init_device_mesh(env.device.type, (cfg.replicas, env.world_size // cfg.replicas),
                                mesh_dim_names=("replicate", "shard"))

    # --- shard: every Block its own unit (gathered one at a time), then the root (the rest) ----
    options = dict(mesh=mesh, reshard_after_forward=fsdp2.parse_reshard(cfg.reshard_after_forward))
    if cfg.mixed_precision:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if cfg.cpu_offload:  # pinned memory needs an accelerator; on CPU ranks it must be off
        options["offload_policy"] = CPUOffloadPolicy(pin_memory=env.device.type == "cuda")
    if shard_fn is not None:
        shard_fn(model, mesh)  # the exercise: your own fully_shard calls
    else:
        for block in model.blocks:
            fully_shard(block, **options)
        fully_shard(model, **options)
    if cfg.prefetch:  # block i all-gathers blocks i+1..i+N in forward, i-1..i-N in backward
        blocks = list(model.blocks)
        for i, block in enumerate(blocks):
            block.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + cfg.prefetch])
            block.set_modules_to_backward_prefetch(blocks[max(0, i - cfg.prefetch):i][::-1])

    # --- init: allocate this rank's shards, then fill weights AND buffers ----------------------
    model.to_empty(device="cpu" if cfg.cpu_offload else env.device)
    if cfg.bug != "meta-buffers":
        model.init_weights()  # skipped (BUG): the causal masks keep whatever to_empty left there
    return model, early_optimizer


def build_classic(cfg, env, reference):
    """Lesson 1's setup: FullyShardedDataParallel with one unit per Block."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    return FSDP(copy.deepcopy(reference),
                auto_wrap_policy=functools.partial(transformer_auto_wrap_policy,
                                                   transformer_layer_cls={Block}),
                sharding_strategy=ShardingStrategy.FULL_SHARD if fsdp2.parse_reshard(
                    cfg.reshard_after_forward) else ShardingStrategy.SHARD_GRAD_OP,
                mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                if cfg.mixed_precision else None,
                device_id=env.device)  # required on CPU too, else FSDP looks for a GPU


def train(cfg, env, data, mesh, reference, shard_fn=None) -> dict:
    """Build one variant, train it, return what was measured and what the checks found."""
    start_build = time.perf_counter()
    early_optimizer = None
    if cfg.api == "classic":
        model = build_classic(cfg, env, reference)
    else:
        model, early_optimizer = build_fsdp2(cfg, env, mesh, reference.cfg, shard_fn)
        renamed = [n for n, _ in model.named_parameters() if n.startswith("_orig_mod.")]
        if renamed:  # torch.compile(model) returned a wrapper that prefixes every name
            problem = (f"torch.compile(model) before fully_shard renamed every parameter "
                       f"({renamed[0]}): the checkpoint's keys (tok_emb.weight, ...) no longer "
                       f"match, so this variant cannot load its weights and is not trained. "
                       f"Compile each block in place (block.compile()) before fully_shard")
            env.print0(f"\n== {fsdp2.variant_label(cfg)} ==\nPROBLEM DETECTED: {problem}")
            return {"label": fsdp2.variant_label(cfg), "api": cfg.api, "config": cfg.__dict__,
                    "problems": [problem], "renamed": renamed[:3], "history": []}
        # Load the reference's weights, as from a checkpoint that rank 0 holds: every variant
        # then trains the same model. Non-persistent buffers (the causal mask) are not in a
        # state dict: only init_weights() above filled them.
        set_model_state_dict(model, reference.state_dict(), options=StateDictOptions(
            full_state_dict=True, broadcast_from_rank0=True))

    # --- optimizer: after sharding, so it holds the sharded (DTensor) parameters ---------------
    optimizer = early_optimizer or torch.optim.AdamW(model.parameters(), lr=cfg.lr)

    # --- checks before training: the layout, the buffers, who the optimizer holds -------------
    rows = fsdp2.dtensor_rows(model, reference) if cfg.api == "fsdp2" else []
    mask_errors = torch.tensor(fsdp2.causal_mask_errors(model))
    dist.all_reduce(mask_errors)  # over all ranks: each rank has its own garbage
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    optimizer_holds_model = all(id(p) in held for p in model.parameters())
    with torch.no_grad():  # step 0's global batch (all micro-batches), in one process
        reference_loss0 = sum(lm_loss(reference(x), y).item() for x, y in (
            data.batch(micro, 0, 1, cfg.batch_size * env.world_size, cfg.seq_len, env.device)
            for micro in range(cfg.grad_accum))) / cfg.grad_accum
    first_shards = [local_tensor(p).detach().clone() for p in model.parameters()]

    # --- loop -----------------------------------------------------------------------------------
    env.print0(f"\n== {fsdp2.variant_label(cfg)} ==")
    logger = MetricLogger(env, cfg.log_every)
    tracked = min(1, cfg.steps - 1)  # one step measured by the trackers (they slow it down)
    memory, collectives, build_s = {}, {}, time.perf_counter() - start_build
    for step in range(cfg.steps):
        measure = step == tracked and not cfg.compile  # dispatch-mode trackers and compile clash
        start = time.perf_counter()
        step_loss = torch.zeros((), device=env.device)
        with CommCounter() if measure else nullcontext() as comm, \
                fsdp2.MemoryProbe(model, optimizer, enabled=measure) as probe:
            for micro in range(cfg.grad_accum):
                last = micro == cfg.grad_accum - 1
                if cfg.grad_accum > 1 and cfg.api == "fsdp2":
                    model.set_requires_gradient_sync(last)  # reduce-scatter on the last only
                x, y = data.batch(step * cfg.grad_accum + micro, env.rank, env.world_size,
                                  cfg.batch_size, cfg.seq_len, env.device)
                with model.no_sync() if cfg.api == "classic" and not last else nullcontext():
                    loss = lm_loss(model(x), y) / cfg.grad_accum
                    loss.backward()
                step_loss += loss.detach()
            probe.before_zero_grad()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        ms = (time.perf_counter() - start) * 1e3
        if measure:
            collectives = comm.summary()
        memory = memory or probe.peaks
        logger.log(step, mean_over_ranks(step_loss), ms, memory.get("peak", 0) / MiB,
                   comm.total_bytes / MiB if measure else 0.0, last=step == cfg.steps - 1)

    # --- report: what changed, what was measured, what the checks say --------------------------
    changed = sum(not torch.equal(a, local_tensor(p)) for a, p in zip(first_shards, model.parameters()))
    loss0 = logger.history[0]["loss"]
    checks = {"mask_errors": int(mask_errors), "loss0": loss0, "reference_loss0": reference_loss0,
              "loss0_matches_reference": abs(loss0 - reference_loss0) < (2e-2 if cfg.mixed_precision else 1e-4),
              "optimizer_holds_model_params": optimizer_holds_model,
              "params_changed": changed, "num_params": len(first_shards)}
    problems = fsdp2.problems(checks, cfg.steps)
    for line in problems or ["checks passed: masks causal, step-0 loss = reference, all shards trained"]:
        env.print0(("PROBLEM DETECTED: " if problems else "") + line)
    times = [row["ms"] for row in logger.history]
    untracked = [t for i, t in enumerate(times) if i not in (0, tracked)] or times
    return {"label": fsdp2.variant_label(cfg), "api": cfg.api, "config": cfg.__dict__,
            "fsdp_units": sum(isinstance(m, fsdp2.unit_types()) for m in model.modules()),
            "dtensor": rows, "memory": memory, "memory_per_rank": fsdp2.gather(memory),
            "collectives": collectives, "checks": checks, "problems": problems,
            "ms_per_step": fsdp2.median(untracked), "first_step_ms": times[0], "build_s": build_s,
            "loss_first": loss0, "loss_last": logger.history[-1]["loss"],
            "history": logger.history}


def main() -> None:
    cfg = parse_config(Config, __doc__)
    with distributed(seed=cfg.seed) as env:
        # --- setup ---------------------------------------------------------------------------
        try:
            variants = fsdp2.expand_variants(cfg, cfg.variants)
            for v in variants:
                fsdp2.validate(v, env.world_size)
        except ValueError as exc:
            raise CourseError(str(exc)) from None
        env.print0(f"lesson 5 | {env.world_size} ranks | {env.backend} on {env.device.type} | {describe(cfg)}")
        data = load_data(cfg.data, seed=cfg.seed)
        # A 1-D mesh over all ranks: parameters become DTensors with placements (Shard(0),).
        mesh = init_device_mesh(env.device.type, (env.world_size,), mesh_dim_names=("shard",))
        shard_fn = fsdp2.load_shard_fn(cfg.shard_module) if cfg.shard_module else None
        # The single-process reference: the same seed on every rank gives the same weights.
        torch.manual_seed(cfg.seed)
        reference = GPT(cfg.model_config(data.vocab_size)).to(env.device)

        runs = [train(v, env, data, mesh, reference, shard_fn) for v in variants]

        # --- report ----------------------------------------------------------------------------
        for run in runs:
            if run.get("dtensor"):  # one table is enough: every FSDP2 variant shards the same way
                env.print0(f"\nDTensor parameters ({run['label']}; blocks.1+ look like blocks.0):")
                env.print0(table(fsdp2.dtensor_table(run["dtensor"], brief=True)))
                break
        env.print0("\nper-rank bytes (rank 0), collectives of one step, time per step:")
        env.print0(table(fsdp2.comparison_rows(runs)))
        history = next((run["history"] for run in reversed(runs) if run["history"]), [])
        write_metrics(cfg.metrics, "lesson5", env, cfg, history, {"runs": runs})


if __name__ == "__main__":
    main()
