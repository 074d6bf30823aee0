"""Lesson 1: classic FSDP (FullyShardedDataParallel) and its sharding strategies.

Trains the course's small GPT with every transformer block wrapped as its own FSDP unit, and
measures what each strategy costs per rank: bytes of parameters, gradients, optimizer state,
all-gathered parameters and activations, and the bytes of each collective per step, printed
next to the theory (``fsdp_course.theory``). The instruments slow a step down, so they watch
one step (step 1) and ms/step is the median of the steps they did not watch (after step 0).
At step 0 it also measures the gradient norm both ways (``torch.nn.utils.clip_grad_norm_`` and
``FSDP.clip_grad_norm_``) against one process. ``--variants`` adds runs with other flags to the
same launch (one torch start-up for all).

    bash launch/lesson1.sh                                  # FULL_SHARD on 2 ranks
    bash launch/lesson1.sh --strategy SHARD_GRAD_OP --metrics runs/sgo.json
    bash launch/lesson1.sh --strategy FULL_SHARD,SHARD_GRAD_OP,NO_SHARD   # one after another
    NPROC=4 bash launch/lesson1.sh --strategy HYBRID_SHARD --replicas 2   # a 2 x 2 mesh
    bash launch/lesson1.sh --strategy HYBRID_SHARD --no-mesh   # FSDP's own groups: read what it ran
    bash launch/lesson1.sh --use-orig-params --d-model 130 --n-heads 2    # alignment padding
    bash launch/lesson1.sh --sync-module-states      # on CPU ranks torch refuses: read why
    bash launch/lesson1.sh \
        --variants "mixed-precision=true;use-orig-params=true,d-model=130,n-heads=2"
    torchrun --standalone --nproc-per-node=2 lessons/01_fsdp_strategies/train.py   # the same
"""

import functools
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

from fsdp_course import theory
from fsdp_course.config import TrainConfig, describe, parse_config, parse_variants
from fsdp_course.data import load_data
from fsdp_course.dist import distributed, mean_over_ranks
from fsdp_course.measure import (
    CommCounter,
    GatheredParamTracker,
    MiB,
    activation_bytes,
    flat_state_bytes,
)
from fsdp_course.model import GPT, Block, lm_loss
from fsdp_course.report import MetricLogger, unwatched_ms, write_metrics
from runs import (
    Strategies,
    decay_groups,
    describe_parameters,
    grad_norms,
    hybrid_groups,
    note_no_shard,
    plan,
    print_report,
    refused_run,
    replica_spread,
    shard_layout,
    theory_bytes,
)


@dataclass
class Config(TrainConfig):
    strategy: Strategies = field(default=Strategies(("FULL_SHARD",)), metadata={
        "parse": Strategies,
        "help": f"one of {', '.join(theory.STRATEGIES)}, or several separated by commas"})
    replicas: int = field(default=2, metadata={"help": "HYBRID_SHARD: replica groups (mesh rows)"})
    mesh: bool = field(default=True, metadata={
        "help": "HYBRID_SHARD: pass a device mesh; --no-mesh lets FSDP build its groups per node"})
    mixed_precision: bool = field(default=False, metadata={
        "help": "compute and communicate in bf16; the sharded master weights stay fp32"})
    use_orig_params: bool = field(default=False, metadata={
        "help": "expose the original parameters (names, per-parameter groups) instead of "
                "flat ones"})
    sync_module_states: bool = field(default=False, metadata={
        "help": "broadcast rank 0's weights while wrapping (needs the module on a GPU)"})
    variants: tuple | None = field(default=None, metadata={
        "parse": parse_variants, "metavar": "'FLAG=V,FLAG=V;...'",
        "help": "more runs after the --strategy ones, each with these flags changed"})


def train(cfg: Config, strategy: str, label: str, env, data) -> dict:
    """Wrap a fresh model with ``strategy``, train it, return what was measured."""
    mesh = None
    if strategy == "HYBRID_SHARD" and cfg.mesh:
        # Without a mesh FSDP sizes a "node" by the devices it counts per node, and a CPU-only
        # machine counts 1: every shard group would be a single rank. Say the shape instead.
        mesh = init_device_mesh(env.device.type, (cfg.replicas, env.world_size // cfg.replicas),
                                mesh_dim_names=("replicate", "shard"))

    # --- model: the same initial weights on every rank (same seed on every rank) ----------
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model_config(data.vocab_size))
    unit_param_numels = theory.sharding.fsdp_unit_param_numels(model, Block)  # root first
    reference = GPT(model.cfg)  # a single-process copy: the gradient norm FSDP should find
    reference.load_state_dict(model.state_dict())

    # --- shard: every Block becomes its own FSDP unit; the rest goes to the root unit -------
    try:
        model = FSDP(
            model,
            auto_wrap_policy=functools.partial(transformer_auto_wrap_policy,
                                               transformer_layer_cls={Block}),
            sharding_strategy=ShardingStrategy[strategy],
            mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
            if cfg.mixed_precision else None,
            device_id=env.device,  # where FSDP moves the module and computes: this rank's GPU, or
                                   # the CPU (left out, FSDP looks for an accelerator)
            sync_module_states=cfg.sync_module_states,  # broadcast rank 0's weights (GPU only)
            use_orig_params=cfg.use_orig_params,  # names and groups kept; torch.compile needs it
            device_mesh=mesh,
        )
    except ValueError as exc:
        if not cfg.sync_module_states:
            raise
        # torch checks the module's device before it broadcasts anything, on every rank alike:
        # no collective is left half-done, so the launch goes on with its next run.
        return refused_run(env, strategy, label, exc)

    ran = model.sharding_strategy.name  # what FSDP runs, which a group of one rank changes

    # --- optimizer: built after wrapping, so it holds the sharded parameters ----------------
    optimizer = torch.optim.AdamW(decay_groups(model), lr=cfg.lr)

    # --- loop ---------------------------------------------------------------------------------
    env.print0(f"\n== {label} ==")
    logger = MetricLogger(env, cfg.log_every)
    watched = min(1, cfg.steps - 1)  # after step 0, so that Adam's state exists when counted
    for step in range(cfg.steps):
        x, y = data.batch(step, env.rank, env.world_size, cfg.batch_size, cfg.seq_len, env.device)
        watch = step == watched  # the instruments slow a step down: they watch this one only
        start = time.perf_counter()
        with (CommCounter() if watch else nullcontext()) as comm, \
                (GatheredParamTracker(model) if watch else nullcontext()) as gathered:
            with activation_bytes(model) if watch else nullcontext() as activations:
                loss = lm_loss(model(x), y)
            loss.backward()
        if watch:  # before zero_grad: gradients still held
            measured = dict(flat_state_bytes(model, optimizer), gathered=gathered.peak,
                            activations=activations["bytes"])
            collectives = comm.summary()
        if step == 0:  # not part of a training step (step 0 is left out of ms/step)
            grad_spread = replica_spread(model, "grad") if strategy == "HYBRID_SHARD" else None
            norms = grad_norms(model, reference, data, cfg, env)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        ms = (time.perf_counter() - start) * 1e3
        logger.log(step, mean_over_ranks(loss), ms, sum(measured.values()) / MiB if watch else None,
                   comm.total_bytes / MiB if watch else None, last=watch or step == cfg.steps - 1)

    # --- report: measured next to theory --------------------------------------------------
    unit_numels = [sum(u) for u in unit_param_numels]
    expected, comm_expected = theory_bytes(cfg, unit_param_numels, env, ran)
    per_rank = [None] * env.world_size
    dist.all_gather_object(per_rank, measured)  # ranks differ by where the padding falls
    factors = {"pre": model._gradient_predivide_factor, "post": model._gradient_postdivide_factor}
    groups = hybrid_groups(model, ran, grad_spread) if strategy == "HYBRID_SHARD" else None
    print_report(env, watched, measured, expected, collectives, comm_expected, 4 * sum(unit_numels),
                 norms, factors, groups)
    return {
        "strategy": strategy, "label": label, "d_model": cfg.d_model,
        "mixed_precision": cfg.mixed_precision, "sync_module_states": cfg.sync_module_states,
        "use_orig_params": cfg.use_orig_params, "replicas": cfg.replicas, "mesh": cfg.mesh,
        "ran_as": ran, "groups": groups,
        "num_params": sum(unit_numels), "unit_numels": unit_numels,
        "unit_param_numels": unit_param_numels, "shard_layout": shard_layout(model, env.world_size),
        "bytes": measured, "bytes_theory": expected, "bytes_per_rank": per_rank,
        "collectives": collectives, "collectives_theory": comm_expected,
        "divide_factors": factors, "grad_norms": norms,
        "parameters": describe_parameters(model, optimizer),
        "watched_step": watched, "ms_per_step": unwatched_ms(logger.history),
        "loss_first": logger.history[0]["loss"], "loss_last": logger.history[-1]["loss"],
        "history": logger.history,
    }


def main() -> None:
    cfg = parse_config(Config, __doc__)
    with distributed(seed=cfg.seed) as env:
        # --- setup ---------------------------------------------------------------------------
        planned = plan(cfg, env.world_size)  # (config, strategy, label, variant): all checked first
        env.print0(f"lesson 1 | {env.world_size} ranks | {env.backend} on {env.device.type} | "
                   f"{describe(cfg)}")
        note_no_shard(env, planned)  # torch warns once per FSDP unit: said once here instead
        data = load_data(cfg.data, seed=cfg.seed)

        runs = [train(c, strategy, label, env, data) for c, strategy, label, v in planned if not v]
        more = [train(c, strategy, label, env, data) for c, strategy, label, v in planned if v]

        if env.device.type == "cuda":
            runs[-1]["cuda_max_allocated"] = torch.cuda.max_memory_allocated(env.device)
        write_metrics(cfg.metrics, "lesson1", env, cfg, runs[-1]["history"],
                      {"runs": runs, "variants": more})


if __name__ == "__main__":
    main()
