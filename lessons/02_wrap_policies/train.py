"""Lesson 2: wrap policies. Which modules become FSDP units decides how much is all-gathered.

Trains the course's small GPT with classic FSDP (FULL_SHARD) under each wrap policy and
measures the FSDP units it made (how many, how large), the peak bytes of all-gathered
(unsharded) parameters during forward and backward, and the collectives of one step, printed
next to the theory (``fsdp_course.wrapping``).

    bash launch/lesson2.sh                                   # --wrap none,transformer on 2 ranks
    bash launch/lesson2.sh --wrap none,transformer,size,custom --metrics runs/wrap.json
    bash launch/lesson2.sh --wrap size,size:20000            # size:N overrides --min-params
    bash launch/lesson2.sh --model staged --wrap transformer # the exercise model: wraps nothing!
    bash launch/lesson2.sh --model staged --wrap custom --policy-file my_policy.py
    torchrun --standalone --nproc-per-node=2 lessons/02_wrap_policies/train.py   # the same

A policy file is a Python file that defines ``policy(module, recurse, nonwrapped_numel) -> bool``.
"""

import functools
import runpy
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import (lambda_auto_wrap_policy, size_based_auto_wrap_policy,
                                         transformer_auto_wrap_policy)

from fsdp_course import theory, wrapping
from fsdp_course.config import TrainConfig, describe, parse_config
from fsdp_course.data import load_data
from fsdp_course.dist import CourseError, distributed, mean_over_ranks
from fsdp_course.measure import MiB, CommCounter, GatheredParamTracker, activation_bytes, state_bytes
from fsdp_course.model import GPT, Block, lm_loss
from fsdp_course.report import MetricLogger, table, write_metrics

WRAPS = ("none", "transformer", "size", "custom")  # size:N = size with --min-params N


@dataclass
class Config(TrainConfig):
    wrap: str = field(default="none,transformer", metadata={
        "help": f"one of {', '.join(WRAPS)} (size:N: threshold N), or several separated by "
                "commas (run one after another)"})
    min_params: int = field(default=100_000, metadata={
        "help": "--wrap size: wrap a module once it holds this many not-yet-wrapped parameters"})
    policy_file: str | None = field(default=None, metadata={
        "help": "--wrap custom: a Python file defining policy(module, recurse, nonwrapped_numel)"})
    model: str = field(default="gpt", metadata={
        "choices": ("gpt", "staged"), "help": "gpt: the course GPT; staged: the exercise model"})
    steps: int = field(default=10, metadata={"help": "optimizer steps per policy"})


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


def build_model(cfg: Config, data) -> nn.Module:
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    if cfg.model == "staged":
        return wrapping.staged_lm(cfg.seq_len, cfg.d_model, cfg.n_layers, cfg.n_heads)
    return GPT(cfg.model_config(data.vocab_size))


def fsdp_units(model: FSDP, world_size: int) -> list[dict]:
    """The units FSDP made, from the wrapped model: name, wrapped class, flat-parameter size
    and the bytes it occupies when all-gathered (every rank's padded shard, fp32)."""
    units = []
    for name, module in model.named_modules():
        if isinstance(module, FSDP) and module._handle is not None:
            flat_param = module._handle.flat_param
            units.append({"unit": name.replace("_fsdp_wrapped_module.", "").replace(
                              "_fsdp_wrapped_module", "") or "(root)",
                          "wraps": type(module.module).__name__,
                          "numel": flat_param._unpadded_unsharded_size.numel(),
                          "gathered_bytes": flat_param.numel() * world_size * 4})
    return units


def train(cfg: Config, wrap: str, env, data, custom_policy) -> dict:
    """Wrap a fresh model under ``wrap``, train it, return what was measured."""
    # --- model: what the policy will wrap, read off the unwrapped model (the theory side) ----
    model = build_model(cfg, data)
    policy = make_policy(wrap, cfg, custom_policy)
    planned = wrapping.policy_units(model, policy)
    unit_numels = wrapping.forward_order(model, planned)  # root first, then forward order

    # --- shard: FULL_SHARD; backward prefetch gathers the next unit while one computes ----------
    model = FSDP(model, auto_wrap_policy=policy,
                 sharding_strategy=ShardingStrategy.FULL_SHARD,
                 backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
                 device_id=env.device)  # required on CPU too, else FSDP looks for a GPU
    units = fsdp_units(model, env.world_size)

    # --- optimizer: built after wrapping, so it holds the sharded flat parameters ------------
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)

    # --- loop ------------------------------------------------------------------------------------
    env.print0(f"\n== --wrap {wrap}: {len(units)} FSDP unit(s) ==")
    env.print0(table([{**u, "MiB": round(u["gathered_bytes"] / MiB, 3)} for u in units]))
    logger = MetricLogger(env, cfg.log_every)
    peak_forward = peak_backward = peak_total = 0
    for step in range(cfg.steps):
        x, y = data.batch(step, env.rank, env.world_size, cfg.batch_size, cfg.seq_len, env.device)
        start = time.perf_counter()
        with CommCounter() as comm:
            with GatheredParamTracker(model) as forward, activation_bytes(model) as activations:
                loss = lm_loss(model(x), y)
            with GatheredParamTracker(model) as backward:
                loss.backward()
            measured = state_bytes(model, optimizer)  # before zero_grad: gradients still held
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        ms = (time.perf_counter() - start) * 1e3
        peak_forward, peak_backward = max(peak_forward, forward.peak), max(peak_backward, backward.peak)
        total = sum(measured.values()) + max(forward.peak, backward.peak) + activations["bytes"]
        peak_total = max(peak_total, total)
        logger.log(step, mean_over_ranks(loss), ms, total / MiB, comm.total_bytes / MiB,
                   last=step == cfg.steps - 1)

    # --- report: measured next to theory -----------------------------------------------------
    gathered = max(peak_forward, peak_backward)
    nested = wrapping.is_nested(planned)
    peaks_theory = {} if nested else theory.wrapping.gathered_peaks(unit_numels, env.world_size)
    per_rank = [None] * env.world_size
    dist.all_gather_object(per_rank, {"gathered": gathered, "total": peak_total})
    calls_theory = theory.wrapping.collective_calls(unit_numels, env.world_size)
    bytes_theory = theory.collective_bytes(unit_numels, env.world_size, "FULL_SHARD")
    param_bytes = 4 * sum(unit_numels)
    env.print0(f"\nall-gathered parameters, peak bytes (theory: fsdp_course.wrapping"
               f"{'; nested units: no formula' if nested else ''}):")
    env.print0(table([{"phase": phase, "measured": value, "theory": peaks_theory.get(phase, "-"),
                       "MiB": round(value / MiB, 3), "x param bytes": round(value / param_bytes, 3)}
                      for phase, value in (("forward", peak_forward), ("backward", peak_backward),
                                           ("step", gathered))]))
    env.print0("\ncollectives in the last step (payload bytes):")
    env.print0(table([{"collective": k, "calls": v["calls"], "theory calls": calls_theory.get(k, 0),
                       "bytes": v["bytes"], "theory bytes": bytes_theory.get(k, 0)}
                      for k, v in comm.summary().items()] or [{"collective": "(none)"}]))
    return {
        "wrap": wrap, "model": cfg.model, "num_params": sum(unit_numels), "units": units,
        "num_units": len(units), "unit_numels_theory": unit_numels,
        "units_theory": [{"unit": name or "(root)", "numel": numel} for name, _, numel in planned],
        "nested": nested,
        "gathered_peak": gathered, "gathered_forward": peak_forward,
        "gathered_backward": peak_backward, "gathered_theory": peaks_theory.get("step"),
        "gathered_theory_by_phase": peaks_theory,
        "per_rank": per_rank, "collectives": comm.summary(),
        "collective_calls_theory": calls_theory, "collective_bytes_theory": bytes_theory,
        "ms_per_step": sorted(row["ms"] for row in logger.history)[len(logger.history) // 2],
        "loss_first": logger.history[0]["loss"], "loss_last": logger.history[-1]["loss"],
        "module_tree": repr(model), "history": logger.history,
    }


def main() -> None:
    cfg = parse_config(Config, __doc__)
    with distributed(seed=cfg.seed) as env:
        # --- setup -----------------------------------------------------------------------------
        wraps = [w.strip().lower() for w in cfg.wrap.split(",") if w.strip()]
        for wrap in wraps or [""]:
            kind, _, threshold = wrap.partition(":")
            if kind not in WRAPS or (threshold and (kind != "size" or not threshold.isdigit())):
                raise CourseError(f"--wrap {wrap!r}: choose from {', '.join(WRAPS)} or size:N")
        custom_policy = None
        if cfg.policy_file:
            if "custom" not in wraps:
                raise CourseError("--policy-file is used by --wrap custom; add custom to --wrap")
            if not Path(cfg.policy_file).is_file():
                raise CourseError(f"--policy-file {cfg.policy_file}: no such file")
            custom_policy = runpy.run_path(cfg.policy_file).get("policy")
            if not callable(custom_policy):
                raise CourseError(f"--policy-file {cfg.policy_file} defines no function "
                                  "policy(module, recurse, nonwrapped_numel)")
        env.print0(f"lesson 2 | {env.world_size} ranks | {env.backend} on {env.device.type} | {describe(cfg)}")
        if env.world_size == 1:
            env.print0("one rank: FSDP falls back to NO_SHARD, so nothing is gathered (try NPROC=2)")
        data = load_data(cfg.data, seed=cfg.seed)

        runs = [train(cfg, wrap, env, data, custom_policy) for wrap in wraps]

        write_metrics(cfg.metrics, "lesson2", env, cfg, runs[-1]["history"], {"runs": runs})


if __name__ == "__main__":
    main()
