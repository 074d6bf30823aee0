"""Lesson 7's runs: variants, the planner's prediction for each, outcomes and tables.

Nothing here is what the lesson teaches (that is in ``train.py``'s ``shard()`` and in
``fsdp_course.theory.memory``); it turns flags into runs and runs into rows.
"""

from __future__ import annotations

import dataclasses

import torch.distributed as dist

import probes
from fsdp_course.config import plan_runs
from fsdp_course.dist import CourseError
from fsdp_course.measure import MiB
from fsdp_course.report import table
from fsdp_course.theory import memory

TRACKED = 2  # the measured step: after two steps (optimizer state exists, DDP rebuilt its buckets)


def quiet(env):
    """The same environment, but no rank prints (for the warm-up runs)."""
    return dataclasses.replace(env, rank=-1)


def api_of(cfg) -> str:
    return "ddp" if cfg.strategy == "DDP" else cfg.api


def label(cfg) -> str:
    """A short name for a run: 'fsdp2 FULL_SHARD bf16 ac=full'."""
    parts = ["DDP"] if cfg.strategy == "DDP" else [cfg.api, cfg.strategy]
    parts += ["bf16"] * cfg.mixed_precision
    if cfg.activation_checkpointing != "none":
        parts.append(f"ac={cfg.activation_checkpointing}")
        parts += ["reentrant"] * cfg.ac_reentrant + ["wrong-order"] * (cfg.ac_order == "wrong")
    parts += [f"offload={cfg.cpu_offload}"] * (cfg.cpu_offload != "none")
    parts += [f"seq={cfg.seq_len}"] * (cfg.seq_len != 64)
    parts += [f"batch={cfg.batch_size}"] * (cfg.batch_size != 8)
    parts += [f"limit={cfg.rank_memory_mib:g}MiB"] * bool(cfg.rank_memory_mib)
    return " ".join(parts)


def blocks_to_checkpoint(model, ac: str) -> list:
    """The blocks to checkpoint: none, all (``full``), or blocks 0, K, 2K, ... (``every-K``)."""
    return [model.blocks[i] for i in memory.checkpointed_blocks(len(model.blocks), ac)]


def shape_of(cfg, vocab_size: int) -> memory.GPTShape:
    return memory.GPTShape(vocab_size, cfg.seq_len, cfg.d_model, cfg.n_layers, cfg.n_heads)


def predict(cfg, world_size: int, vocab_size: int, device_type: str = "cpu") -> dict:
    """The planner's figures for this run (the same call as ``python -m fsdp_course.plan``).
    AdamW steps tensor by tensor on CPU and with ``foreach`` on GPUs: the planner is told."""
    return memory.plan(shape_of(cfg, vocab_size), cfg.batch_size, world_size,
                       strategy=cfg.strategy, api=cfg.api, foreach=device_type == "cuda",
                       precision="bf16-mixed" if cfg.mixed_precision else "fp32",
                       ac=cfg.activation_checkpointing,
                       gpu_bytes=cfg.rank_memory_mib * MiB if cfg.rank_memory_mib else None,
                       reserve=memory.CPU_RANK_RESERVE if device_type == "cpu"
                       else memory.ALLOWANCE_MIN)


def limit_verdict(cfg, prediction: dict) -> str:
    if "fits" not in prediction:
        return ""
    verdict = "fits" if prediction["fits"] else "does NOT fit"
    return (f" + allowance {prediction['allowance'] / MiB:.2f} = {prediction['needed'] / MiB:.2f} "
            "MiB"
            f" vs limit {cfg.rank_memory_mib:g} MiB: {verdict}")


def expand(cfg, world_size: int) -> list:
    """One config per variant (each the command line's config with its changes), or just
    ``cfg``; each checked: a CourseError (one sentence) for a flag a variant cannot set or a
    variant that makes no sense."""
    variants = [config for config, _ in plan_runs(cfg, with_base=False)]
    try:
        for v in variants:
            check(v)
    except ValueError as exc:
        raise CourseError(str(exc)) from None
    return variants


def check(v) -> None:
    """ValueError with one sentence if the run ``v`` makes no sense."""
    memory.checkpointed_blocks(v.n_layers, v.activation_checkpointing)  # ValueError if bad
    if v.api == "fsdp2" and v.strategy == "NO_SHARD":
        raise ValueError("api=fsdp2 has no NO_SHARD: a full replica per rank is strategy=DDP")
    if v.strategy == "DDP" and (v.cpu_offload != "none" or v.mixed_precision):
        raise ValueError("strategy=DDP: --cpu-offload and --mixed-precision belong to FSDP "
                         "here")
    if v.ac_reentrant and v.api == "fsdp2" and v.strategy != "DDP":
        raise ValueError("--ac-reentrant: FSDP2's checkpoint() is non-reentrant only "
                         "(api=classic)")
    if v.strategy not in memory.STRATEGIES or v.api not in memory.APIS:
        raise ValueError(f"strategy={v.strategy}, api={v.api}: choose from "
                         f"{', '.join(memory.STRATEGIES)} and {', '.join(memory.APIS)}")
    if v.cpu_offload not in ("none", "params", "params-pinned") or v.ac_order not in ("right",
                                                                                      "wrong"):
        raise ValueError(f"cpu-offload={v.cpu_offload}, ac-order={v.ac_order}: not a choice")
    if v.steps <= TRACKED:
        raise ValueError(f"--steps must be > {TRACKED}: step {TRACKED} is the measured one")
    if v.rank_memory_mib < 0:
        raise ValueError("--rank-memory-mib must be >= 0")


def prepare_allocator(cfg) -> None:
    """Before any thread starts: a run under a memory limit needs freed memory returned to the
    system at once (probes explains why)."""
    if cfg.rank_memory_mib or any("rank_memory_mib" in v for v in cfg.variants or ()):
        probes.return_freed_memory_at_once()


def run_all(variants: list, train) -> list[dict]:
    """``train(config, announce=True)`` for every variant: the runs under a limit first (after a
    warm-up: threads, gloo buffers), then the others with the allocator keeping freed memory
    again (faster: probes explains why)."""
    limited = [v for v in variants if v.rank_memory_mib]
    for warm_up in warm_ups(limited):
        train(warm_up, announce=False)
    results = [train(v) for v in limited]
    if limited:
        probes.keep_freed_memory_again()
    return results + [train(v) for v in variants if not v.rank_memory_mib]


def planned(cfg, env, vocab_size: int, announce: bool) -> tuple[str, dict]:
    """The run's label and the planner's prediction. The planner speaks first: its verdict is
    printed before the run (not for a warm-up)."""
    prediction = predict(cfg, env.world_size, vocab_size, env.device.type)
    if announce:
        env.print0(f"\n== {label(cfg)} ==  planner: peak {prediction['peak'] / MiB:.2f} MiB/rank "
                   f"({prediction['peak_moment']})" + limit_verdict(cfg, prediction))
    return label(cfg), prediction


def warm_ups(variants: list) -> list:
    """One tiny run per kind of run, without a limit, before any limited run: the threads,
    allocator arenas and communication buffers a run needs then exist already, so the limit
    measures the model, not the runtime's first start."""
    seen, tiny = set(), []
    for v in variants:
        key = (api_of(v), v.strategy, v.mixed_precision)
        if key not in seen:
            seen.add(key)
            tiny.append(dataclasses.replace(v, d_model=32, n_layers=1, n_heads=2, batch_size=2,
                                            steps=TRACKED + 1, rank_memory_mib=0.0,
                                            activation_checkpointing="none", log_every=10 ** 6))
    return tiny


def is_expected_failure(exc: BaseException, cfg) -> bool:
    """An allocation refused (the limit, or a GPU out of memory), or offload's accelerator
    requirement: failures the lesson shows. Anything else is a bug and propagates."""
    text = str(exc)
    if isinstance(exc, MemoryError) or "can't allocate memory" in text or "out of memory" in text:
        return True
    if cfg.rank_memory_mib and "could not create a primitive" in text:
        return True  # oneDNN (CPU matmuls) could not allocate its workspace under the limit
    return cfg.cpu_offload != "none" and "accelerator" in text


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def timing(history: list[dict]) -> dict:
    """ms per step, wall and CPU (this rank's own work: on a shared machine it varies less than
    the wall clock), over the steps that are neither the first nor the measured one: the
    fastest, since other processes on the machine only ever add time."""
    plain = [row for row in history if row["step"] not in (0, TRACKED)]
    fastest = lambda key: min(row[key] for row in plain) if plain else float("nan")  # noqa: E731
    return {"ms_per_step": fastest("ms"), "cpu_ms_per_step": fastest("cpu_ms"),
            "loss_first": history[0]["loss"], "loss_last": history[-1]["loss"]}


def gather_outcomes(results: list[dict]) -> list[dict]:
    """Every rank's outcome of every run: 'trained' or its error line (a collective)."""
    mine = [r.get("error", "trained") for r in results]
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return [{"label": r["label"], "per_rank": [ranks[i] for ranks in every]}
            for i, r in enumerate(results)]


def _mib(value) -> float | str:
    return round(value / MiB, 3) if isinstance(value, (int, float)) else "-"


def comparison_rows(results: list[dict], outcomes: list[dict] | None = None) -> list[dict]:
    """One row per run: predicted / measured per category and the peak, in MiB (rank 0)."""
    rows = []
    for i, r in enumerate(results):
        pred, meas, state = r["prediction"], r.get("measured", {}), r.get("state", {})
        cats = pred["categories"]
        row = {"run": r["label"]}
        for key in ("params", "grads", "optimizer"):
            row[key] = f"{_mib(cats[key])} / {_mib(state.get(key))}"
        gathered = meas.get("at_peak", {}).get("gathered")
        row["gathered"] = f"{_mib(pred['at_peak'].get('gathered', 0))} / {_mib(gathered)}"
        row["activations"] = f"{_mib(cats['activations'])} / {_mib(meas.get('activations'))}"
        row["peak"] = f"{_mib(pred['peak'])} / {_mib(meas.get('peak'))}"
        row["peak error"] = (f"{100 * (pred['peak'] - meas['peak']) / meas['peak']:+.1f}%"
                             if meas.get("peak") else "-")
        if any(x["config"]["rank_memory_mib"] for x in results):  # the address space rank 0 grew by
            row["grew by"] = _mib(r.get("vm_growth"))
        if outcomes:
            ranks = outcomes[i]["per_rank"]
            row["outcome"] = "trained" if all(o == "trained" for o in ranks) else \
                f"failed on {sum(o != 'trained' for o in ranks)}/{len(ranks)} ranks"
        rows.append(row)
    return rows


def print_report(env, results: list[dict]) -> list[dict]:
    """Every rank's outcome, and rank 0's table: planner (predicted) vs trackers (measured)."""
    outcomes = gather_outcomes(results)
    env.print0("\nper rank, rank 0: planner (predicted) vs trackers (measured), MiB")
    env.print0(table(comparison_rows(results, outcomes)))
    return outcomes
