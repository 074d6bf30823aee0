"""Lesson 2: wrap policies. Which modules become FSDP units decides how much is all-gathered at
once and how many bytes move; the prefetch options decide *when* each unit is gathered.

Trains the course's small GPT with classic FSDP (FULL_SHARD) under each wrap policy and each
prefetch setting (one after another in one launch) and measures the units FSDP made, the peak
bytes of all-gathered parameters in forward and backward, and the collectives of one step,
next to the theory (``fsdp_course.theory.wrapping``). The instruments slow a step down, so they
watch one step (step 1) and ms/step is the median of the later steps they do not watch.
``--timeline`` records that step too: when each unit is gathered, computes and is freed, per rank.
``--variants`` adds runs after those, each with a few of the command line's flags changed (so the
notebook is one launch); each run reports its wrap, prefetch, model, timeline and variant.

    bash launch/lesson2.sh                                   # --wrap none,transformer on 2 ranks
    bash launch/lesson2.sh --wrap none,transformer,size,custom --metrics runs/wrap.json
    bash launch/lesson2.sh --wrap size,size:20000            # size:N overrides --min-params
    bash launch/lesson2.sh --wrap transformer --prefetch pre,post,none,forward,no-limit --timeline
    bash launch/lesson2.sh --model staged --wrap transformer # the exercise model: wraps nothing!
    bash launch/lesson2.sh --model staged --wrap custom --policy-file my_policy.py
    bash launch/lesson2.sh --variants "prefetch=post,timeline=true;model=staged,wrap=transformer"
    torchrun --standalone --nproc-per-node=2 lessons/02_wrap_policies/train.py  # = the first

A policy file is a Python file that defines ``policy(module, recurse, nonwrapped_numel) -> bool``.
"""

import functools
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import (
    lambda_auto_wrap_policy,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)

import runs
from fsdp_course import wrapping
from fsdp_course.config import TrainConfig, describe, parse_config, parse_variants
from fsdp_course.data import load_data
from fsdp_course.dist import distributed, mean_over_ranks
from fsdp_course.measure import (
    CommCounter,
    GatheredParamTracker,
    MiB,
    activation_bytes,
    state_bytes,
)
from fsdp_course.model import GPT, Block, lm_loss
from fsdp_course.report import MetricLogger, write_metrics
from runs import Prefetches, Wraps
from staged_lm import staged_lm
from timeline import StepTimeline

# When FSDP gathers each unit (--prefetch). FSDP's defaults: BACKWARD_PRE, no forward
# prefetch, limit_all_gathers=True.
PREFETCH = {
    # next unit when one starts backward
    "pre": dict(backward_prefetch=BackwardPrefetch.BACKWARD_PRE),
    "post": dict(backward_prefetch=BackwardPrefetch.BACKWARD_POST),  # ... when one has finished
    "none": dict(backward_prefetch=None),                            # each unit when it is needed
    "forward": dict(forward_prefetch=True),                          # also the next unit in forward
    "no-limit": dict(limit_all_gathers=False),                       # no cap on gathers in flight
}


@dataclass
class Config(TrainConfig):
    wrap: Wraps = field(default=Wraps("none,transformer"), metadata={"help": Wraps.expected})
    prefetch: Prefetches = field(default=Prefetches("pre"), metadata={
        "help": "FSDP's prefetch settings to run (every --wrap with every --prefetch): "
                + Prefetches.expected})
    timeline: bool = field(default=False, metadata={"help": "record the measured step of each run"})
    min_params: int = field(default=100_000, metadata={
        "help": "--wrap size: wrap a module once it holds this many not-yet-wrapped parameters"})
    policy_file: str | None = field(default=None, metadata={
        "help": "--wrap custom: a Python file defining policy(module, recurse, nonwrapped_numel)"})
    model: str = field(default="gpt", metadata={
        "choices": ("gpt", "staged"), "help": "gpt: the course GPT; staged: the exercise model"})
    steps: int = field(default=10, metadata={"help": "optimizer steps per run"})
    variants: tuple | None = field(default=None, metadata={
        "parse": parse_variants, "metavar": "'FLAG=V,FLAG=V;...'",
        "help": "more runs after the --wrap x --prefetch ones, each with these flags changed "
                "(one value per list flag; --policy-file and --data stay the command line's)"})


def make_policy(wrap: str, cfg: Config, custom_policy):
    """The auto-wrap policy for ``--wrap``: FSDP calls it as policy(module, recurse, numel)."""
    if wrap == "none":
        return None  # no policy: the root is the only unit, the whole model in one flat parameter
    if wrap == "transformer":
        # One unit per transformer block, found by its class (a class the model does not
        # contain silently wraps nothing: try --model staged).
        return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
    if wrap.startswith("size"):
        # A module becomes a unit once its not-yet-wrapped parameters reach the threshold.
        min_params = int(wrap.partition(":")[2] or cfg.min_params)
        return functools.partial(size_based_auto_wrap_policy, min_num_params=min_params)
    if custom_policy is not None:
        return custom_policy  # --policy-file
    # Any rule on the module itself: here every block and every embedding gets its own unit.
    return functools.partial(lambda_auto_wrap_policy,
                             lambda_fn=lambda module: isinstance(module, (Block, nn.Embedding)))


def train(cfg: Config, wrap: str, prefetch: str, env, data, custom_policy) -> dict:
    """Wrap a fresh model under ``wrap`` and ``prefetch``, train it, return what was measured."""
    # --- model: the same weights on every rank; what the policy will wrap, read off it -------
    torch.manual_seed(cfg.seed)
    model = (staged_lm(cfg.seq_len, cfg.d_model, cfg.n_layers, cfg.n_heads) if cfg.model == "staged"
             else GPT(cfg.model_config(data.vocab_size)))
    policy = make_policy(wrap, cfg, custom_policy)
    planned = wrapping.policy_units(model, policy)
    unit_numels = wrapping.forward_order(model, planned)  # root first, then forward order

    # --- shard: FULL_SHARD, the policy's units, the prefetch setting under study ---------------
    model = FSDP(model, auto_wrap_policy=policy, sharding_strategy=ShardingStrategy.FULL_SHARD,
                 device_id=env.device,  # required on CPU too, else FSDP looks for a GPU
                 **PREFETCH[prefetch])
    units = wrapping.fsdp_units(model, env.world_size)

    # --- optimizer: built after wrapping, so it holds the sharded flat parameters ------------
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)

    # --- loop ------------------------------------------------------------------------------------
    runs.print_units(env, cfg, wrap, prefetch, units)
    logger = MetricLogger(env, cfg.log_every)
    watched = min(1, cfg.steps - 1)  # after step 0: prefetching follows the order step 0 recorded
    for step in range(cfg.steps):
        x, y = data.batch(step, env.rank, env.world_size, cfg.batch_size, cfg.seq_len, env.device)
        watch = step == watched  # the instruments slow a step down: they watch this one only
        if watch and cfg.timeline:
            dist.barrier()  # the ranks start the recorded step together: one time axis
        timeline = StepTimeline(model, enabled=watch and cfg.timeline)
        start = time.perf_counter()
        with CommCounter() if watch else nullcontext() as comm, timeline:
            with (GatheredParamTracker(model) if watch else nullcontext() as forward,
                  activation_bytes(model) if watch else nullcontext() as activations,
                  timeline.phase("forward")):
                loss = lm_loss(model(x), y)
            with (GatheredParamTracker(model) if watch else nullcontext() as backward,
                  timeline.phase("backward")):
                loss.backward()
            if watch:
                measured = state_bytes(model, optimizer)  # before zero_grad: gradients still held
                peak_forward, peak_backward = forward.peak, backward.peak
                collectives = comm.summary()
                total = sum(measured.values()) + max(forward.peak,
                                                     backward.peak) + activations["bytes"]
            with timeline.phase("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        ms = (time.perf_counter() - start) * 1e3
        logger.log(step, mean_over_ranks(loss), ms, total / MiB if watch else None,
                   comm.total_bytes / MiB if watch else None, last=watch or step == cfg.steps - 1)
        if watch:
            recorded = timeline.events

    # --- report: measured next to theory (runs.theory_of: fsdp_course.theory) ---------------
    per_rank = [None] * env.world_size
    dist.all_gather_object(per_rank, {"gathered": max(peak_forward, peak_backward), "total": total,
                                      "timeline": recorded})
    run = {
        "wrap": wrap, "prefetch": prefetch,
        "fsdp_args": {k: str(v) for k, v in PREFETCH[prefetch].items()},
        "model": cfg.model, "num_params": sum(unit_numels), "units": units, "num_units": len(units),
        **runs.theory_of(planned, unit_numels, PREFETCH[prefetch], env.world_size),
        "gathered_peak": max(peak_forward, peak_backward), "gathered_forward": peak_forward,
        "gathered_backward": peak_backward, "collectives": collectives,
        "per_rank": [{k: v for k, v in r.items() if k != "timeline"} for r in per_rank],
        "timeline": [r["timeline"] for r in per_rank] if cfg.timeline else None,
        "watched_step": watched, **runs.step_time(logger.history, watched),
        "loss_first": logger.history[0]["loss"], "loss_last": logger.history[-1]["loss"],
        "module_tree": repr(model), "history": logger.history,
    }
    runs.print_report(env, run, collectives)
    return run


def main() -> None:
    cfg = parse_config(Config, __doc__)
    with distributed(seed=cfg.seed) as env:
        # --- setup -----------------------------------------------------------------------------
        plan = runs.run_plan(cfg)  # (config, wrap, prefetch, variant) of every run, checked first
        custom_policy = runs.load_policy(cfg.policy_file, {wrap for _, wrap, _, _ in plan})
        env.print0(f"lesson 2 | {env.world_size} ranks | {env.backend} on {env.device.type} | "
                   f"{describe(cfg)}")
        runs.note_one_rank(env)
        data = load_data(cfg.data, seed=cfg.seed)
        done = [train(run_cfg, wrap, prefetch, env, data, custom_policy) | {"variant": variant}
                for run_cfg, wrap, prefetch, variant in plan]
        write_metrics(cfg.metrics, "lesson2", env, cfg, done[-1]["history"], {"runs": done})


if __name__ == "__main__":
    main()
