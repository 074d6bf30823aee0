"""Lesson 5's runs (what the lesson is not about): flags into runs, lesson 1's classic build
for ``--api classic``, the checks that catch the pitfalls, each run's summary, and the tables
and metrics file the script writes.

The FSDP2 calls themselves are in ``train.py``; the measurements in
``fsdp_course.measure_fsdp2``; the formulas in ``fsdp_course.theory.fsdp2``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import logging
import re
import statistics
import warnings
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from fsdp_course.config import plan_runs
from fsdp_course.dist import CourseError
from fsdp_course.measure import MiB, local_tensor
from fsdp_course.measure_fsdp2 import SUM_KEYS, causal_mask_errors, dtensor_rows
from fsdp_course.model import GPT, Block, ModelConfig, lm_loss
from fsdp_course.report import table, write_metrics

APIS = ("fsdp2", "classic")
BUGS = ("meta-buffers", "optimizer-first")
COMPILES = ("none", "blocks", "model-before", "model-after")


def silence_known_warnings() -> None:
    """Two warnings every run would print (once per rank), both harmless here: init_weights()
    draws random numbers into DTensor shards on a CPU mesh ("DTensor random operators may not
    have complete support", and the weights are then replaced by the reference's anyway), and
    FSDP2 warns that the model returns a view (the logits): only an in-place op on that view
    would skip its hook, and nothing here writes into the logits."""
    warnings.filterwarnings("ignore", message="DTensor random operators")
    warnings.filterwarnings("ignore", message=".*returned a view tensor")


# --- flags -> runs -------------------------------------------------------------------------------

def parse_reshard(text) -> bool | int | None:
    """``--reshard-after-forward`` as ``fully_shard`` takes it: ``default`` -> None (FSDP2
    chooses: True for every block, False for the root), ``true``, ``false``, or a group size
    (an int: reshard over groups of that many ranks). The config's parser for the flag."""
    if text is None or isinstance(text, bool):
        return text
    word = str(text).strip().lower()
    if word in ("default", "none"):
        return None
    if word in ("true", "false"):
        return word == "true"
    if word.isdigit() and int(word) >= 1:
        return int(word)
    raise argparse.ArgumentTypeError(f"default, true, false or a group size >= 1, not {text!r}")


def checked_variants(cfg, world_size: int) -> list:
    """The configs of the launch's runs: each ``--variants`` entry (the command line's config
    with its flags changed, each typed like its flag), or the command line's alone; each one
    ``validate``-d. A CourseError (one line for the learner, exit 2) for flags that mean nothing."""
    variants = [config for config, _ in plan_runs(cfg, with_base=False)]
    try:
        for variant in variants:
            validate(variant, world_size)
    except ValueError as exc:
        raise CourseError(str(exc)) from None
    return variants


def reshard_word(value) -> str:
    return "default" if value is None else str(value).lower()


def variant_label(cfg) -> str:
    """A short name for a run: 'fsdp2 raf=true bf16 prefetch=2'."""
    parts = [cfg.api, f"raf={reshard_word(cfg.reshard_after_forward)}"]
    parts += ["bf16"] * cfg.mixed_precision + [f"prefetch={cfg.prefetch}"] * bool(cfg.prefetch)
    parts += [f"accum={cfg.grad_accum}"] * (cfg.grad_accum > 1) + ["offload"] * cfg.cpu_offload
    parts += [f"compile={cfg.compile}"] * (cfg.compile != "none") + ["fullgraph"] * cfg.fullgraph
    parts += [f"bug={cfg.bug}"] * bool(cfg.bug)
    parts += [f"hsdp {cfg.replicas}x"] * (cfg.replicas > 1)
    parts += ["shard-module"] * bool(cfg.shard_module)
    return " ".join(parts)


def validate(cfg, world_size: int) -> None:
    """Refuse flag combinations that mean nothing (ValueError: the script makes it one line)."""
    reshard = cfg.reshard_after_forward
    if cfg.api == "classic":
        fsdp2_only = {"--bug": cfg.bug, "--shard-module": cfg.shard_module,
                      "--prefetch": cfg.prefetch,
                      "--cpu-offload": cfg.cpu_offload, "--compile": cfg.compile != "none",
                      "--replicas": cfg.replicas > 1}
        used = [flag for flag, value in fsdp2_only.items() if value]
        if used:
            raise ValueError(f"api=classic: {', '.join(used)} belong to the FSDP2 path here "
                             "(api=fsdp2)")
        if reshard not in (None, False):
            raise ValueError("api=classic: reshard-after-forward default (FULL_SHARD: the root is "
                             "never resharded) or false (SHARD_GRAD_OP)")
    shards = world_size // max(cfg.replicas, 1)
    if isinstance(reshard, int) and not isinstance(reshard, bool) and shards % reshard:
        raise ValueError(f"--reshard-after-forward {reshard}: must divide the {shards} ranks of a "
                         "shard group")
    if cfg.replicas < 1 or world_size % cfg.replicas:
        raise ValueError(f"--replicas {cfg.replicas}: must divide the {world_size} ranks")
    if cfg.grad_accum < 1 or cfg.steps < 1 or cfg.prefetch < 0:
        raise ValueError("--grad-accum and --steps must be >= 1, --prefetch >= 0")
    if cfg.fullgraph and cfg.compile == "none":
        raise ValueError("--fullgraph needs --compile")


# --- what the runs say ---------------------------------------------------------------------------

@contextmanager
def fully_shard_notices():
    """Collect what ``fully_shard`` logs while the model is sharded (e.g. that the int 1 means
    False), instead of one copy per rank in the raw log: the script prints it once."""
    notices: list[str] = []
    logger = logging.getLogger("torch.distributed.fsdp.fully_shard")
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: notices.append(f"fully_shard warns: {record.getMessage()}")
    logger.addHandler(handler)
    saved, logger.propagate = logger.propagate, False
    try:
        yield notices
    finally:
        logger.removeHandler(handler)
        logger.propagate = saved


_warmed_up: set[str] = set()


def forget_compiled(cfg) -> None:
    """With ``--compile``: drop what torch.compile cached in this process (graphs, counters),
    so that this variant compiles from scratch and its first step shows the compile time. The
    compiler's one-time set-up (imports, first use of the backend) is paid here, on a toy
    function, so that it is not charged to whichever variant comes first."""
    if cfg.compile == "none":
        return
    from torch._dynamo.utils import counters

    if cfg.compile_backend not in _warmed_up:
        torch.compile(lambda x: x * 2, backend=cfg.compile_backend)(torch.ones(2))
        _warmed_up.add(cfg.compile_backend)
    torch._dynamo.reset()
    counters.clear()


@contextmanager
def compile_failure(cfg):
    """With ``--compile``, an error of the compiler (torch._dynamo) is a result: it is kept as
    ``{"error": first lines}`` and the run stops there; without, errors pass through."""
    failed: dict = {}
    if cfg.compile == "none":
        yield failed
        return
    try:
        yield failed
    except torch._dynamo.exc.TorchDynamoException as exc:
        text = str(exc).strip()
        failed["error"] = f"{type(exc).__name__}: {text.splitlines()[0]}"
        # Where Dynamo was when it gave up ("from user code:"): file, line and function.
        frames = re.findall(r'File "([^"]+)", line (\d+), in (\w+)',
                            text.partition("from user code:")[2])
        failed["trace"] = [f"{'/'.join(Path(f).parts[-2:])}:{line} {fn}" for f, line, fn in frames]


@functools.cache
def _plain_meta_gpt(dims: tuple) -> GPT:
    """An uncompiled GPT of these ``ModelConfig`` fields on the meta device, built once per
    process: on the meta device every init op runs through Python, and every variant asks."""
    with torch.device("meta"):
        return GPT(ModelConfig(*dims))


def export_check(model, model_cfg) -> str:
    """What an uncompiled GPT says when it strictly loads the keys of this model's
    ``state_dict()`` (what ``torch.save(model.state_dict())`` would carry): "ok", or the head of
    its error and the keys it names. Meta tensors into a meta model: only keys and shapes count."""
    exported = {k: torch.empty(v.shape, dtype=v.dtype, device="meta")
                for k, v in model.state_dict().items()}
    plain = _plain_meta_gpt(dataclasses.astuple(model_cfg))
    try:
        plain.load_state_dict(exported, strict=True)
        return "ok"
    except RuntimeError as exc:
        head = str(exc).partition(":")[0]  # "Error(s) in loading state_dict for GPT"
    keys = plain.load_state_dict(exported, strict=False)  # the same keys, as lists
    return (f"{head}: {len(keys.missing_keys)} missing keys ({', '.join(keys.missing_keys[:2])}, "
            "...), "
            f"{len(keys.unexpected_keys)} unexpected ({', '.join(keys.unexpected_keys[:2])}, ...)")


_reference_losses: dict[tuple, float] = {}


def reference_loss0(cfg, env, data, reference) -> float:
    """The single-process reference's step-0 loss on the same global batch (all micro-batches).
    The reference is never trained: variants with the same batches share one computation."""
    key = (id(reference), cfg.batch_size * env.world_size, cfg.seq_len, cfg.grad_accum)
    if key not in _reference_losses:
        with torch.no_grad():
            _reference_losses[key] = sum(lm_loss(reference(x), y).item() for x, y in (
                data.batch(micro, 0, 1, cfg.batch_size * env.world_size, cfg.seq_len, env.device)
                for micro in range(cfg.grad_accum))) / cfg.grad_accum
    return _reference_losses[key]


def checks_before_training(cfg, env, data, model, optimizer, reference) -> dict:
    """The layout, the buffers, who the optimizer holds, and the reference's step-0 loss."""
    mask_errors = torch.tensor(causal_mask_errors(model))
    dist.all_reduce(mask_errors)  # over all ranks: each rank has its own garbage
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    return {"dtensor": dtensor_rows(model, reference) if cfg.api == "fsdp2" else [],
            "first_shards": [local_tensor(p).detach().clone() for p in model.parameters()],
            "export": export_check(model, reference.cfg) if cfg.api == "fsdp2" else "ok",
            "classes": [type(model).__name__, type(model.blocks[0]).__name__],
            "checks": {"mask_errors": int(mask_errors),
                       "reference_loss0": reference_loss0(cfg, env, data, reference),
                       "optimizer_holds_model_params": all(id(p) in held
                                                           for p in model.parameters())}}


def problems(checks: dict, steps: int) -> list[str]:
    """The pitfalls the checks reveal, one sentence each (empty: none)."""
    found = []
    if checks["mask_errors"]:
        found.append(f"{checks['mask_errors']} attention mask buffer(s) (all ranks) are not "
                     "causal: "
                     "to_empty() left them uninitialised and the state dict does not carry them "
                     "(call model.init_weights() after to_empty)")
    if not checks["loss0_matches_reference"]:
        found.append(f"step-0 loss {checks['loss0']:.4f} != single-process reference "
                     f"{checks['reference_loss0']:.4f} on the same weights and batch")
    if not checks["optimizer_holds_model_params"]:
        found.append(f"the optimizer does not hold the model's parameters: only "
                     f"{checks['params_changed']} of {checks['num_params']} shards changed in "
                     f"{steps} steps (build the optimizer after fully_shard)")
    elif steps > 1 and checks["params_changed"] < checks["num_params"]:
        found.append(f"only {checks['params_changed']} of {checks['num_params']} shards changed")
    return found


def _summary(cfg, before: dict) -> dict:
    return {"label": variant_label(cfg), "api": cfg.api, "config": cfg.__dict__,
            "dtensor": before["dtensor"], "export": before["export"], "notices": before["notices"],
            "classes": before["classes"]}


def stopped_run(cfg, env, before: dict, failed: dict) -> dict:
    """A variant the compiler refused: what it said, nothing trained."""
    env.print0(f"compile error (torch {torch.__version__}): {failed['error']}")
    env.print0("  where: " + " -> ".join(failed["trace"]))
    if before["export"] != "ok":
        env.print0(f"plain load_state_dict of its state_dict(): {before['export']}")
    return {**_summary(cfg, before), "compile_error": failed["error"],
            "compile_trace": failed["trace"], "problems": [],
            "checks": before["checks"], "history": []}


def finished_run(cfg, env, model, before: dict, history: list[dict], tracked: int,
                 memory: dict, collectives: dict, kept: list | None) -> dict:
    """What a trained variant measured, and the pitfalls its checks found (printed on rank 0)."""
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel

    changed = sum(not torch.equal(a, local_tensor(p)) for a,
                  p in zip(before["first_shards"], model.parameters()))
    checks = dict(before["checks"], loss0=history[0]["loss"], params_changed=changed,
                  num_params=len(before["first_shards"]))
    tolerance = 2e-2 if cfg.mixed_precision else 1e-4
    checks["loss0_matches_reference"] = abs(checks["loss0"] - checks["reference_loss0"]) < tolerance
    found = problems(checks, cfg.steps)
    passed = "checks passed: masks causal, step-0 loss = reference, all shards trained"
    for line in found or [passed]:
        env.print0(("PROBLEM DETECTED: " if found else "") + line)
    if before["export"] != "ok":
        env.print0(f"plain load_state_dict of its state_dict(): {before['export']}")
    times = [row["ms"] for row in history]
    untracked = [t for i, t in enumerate(times) if i not in (0, tracked)] or times[1:] or times
    compiled = {}
    if cfg.compile != "none":
        from torch._dynamo.utils import counters
        compiled = {"unique_graphs": counters["stats"]["unique_graphs"],
                    "ops_captured": counters["stats"]["calls_captured"],
                    "graph_breaks": sum(counters["graph_break"].values())}
    every_rank = [None] * dist.get_world_size()
    dist.all_gather_object(every_rank, memory)
    return {**_summary(cfg, before), "checks": checks, "problems": found,
            "fsdp_units": sum(isinstance(m, (FSDPModule, FullyShardedDataParallel))
                              for m in model.modules()),
            "memory": memory, "memory_per_rank": every_rank, "collectives": collectives,
            "kept_after_forward": kept, "compiled": compiled,
            "ms_per_step": statistics.median(untracked), "first_step_ms": times[0],
            "loss_first": history[0]["loss"], "loss_last": history[-1]["loss"], "history": history}


# --- tables ---------------------------------------------------------------------------------------

def dtensor_table(rows: list[dict], brief: bool = False) -> list[dict]:
    """Rows for printing: with ``brief``, the parameters outside the blocks and block 0 only."""
    keep = [r for r in rows if not brief or ".blocks." not in f".{r['name']}"
            or ".blocks.0." in f".{r['name']}"]
    return [{"parameter": r["name"], "placements": r["placements"], "global": tuple(r["global"]),
             "local per rank": " ".join(str(tuple(s)) for s in r["local"]),
             "stored bytes per rank": " ".join(map(str, r["stored"])),
             "full_tensor() == reference": r.get("full_equal", "-")} for r in keep]


def comparison_rows(runs: list[dict]) -> list[dict]:
    """One row per measured run: memory categories (MiB, rank 0), collective MiB, ms/step, loss."""
    rows = []
    for run in runs:
        if not run.get("memory"):  # stopped before training, or compiled (no instruments)
            continue
        mem, comm = run["memory"], run["collectives"]
        row = {"run": run["label"]}
        for key in (*SUM_KEYS, "all_gather_buffer", "unsharded_grads", "held_after_forward",
                    "peak"):
            row[key] = round(mem[key] / MiB, 3) if key in mem else "-"
        row["all_gather MiB"] = round(comm.get("all_gather", {}).get("bytes", 0) / MiB, 3)
        row["reduce_scatter MiB"] = round(comm.get("reduce_scatter", {}).get("bytes", 0) / MiB, 3)
        row["ms/step"] = round(run["ms_per_step"], 1)
        row["loss last"] = round(run["loss_last"], 4)
        rows.append(row)
    return rows


def print_report(env, runs: list[dict]) -> None:
    """The DTensor layout (once: every FSDP2 variant shards the same way) and the comparison."""
    for run in sorted(runs, key=lambda r: (r["config"]["compile"] != "none",
                                           bool(r["config"]["bug"]))):
        if run.get("dtensor"):
            env.print0(f"\nDTensor parameters ({run['label']}; blocks.1+ look like blocks.0):")
            env.print0(table(dtensor_table(run["dtensor"], brief=True)))
            break
    rows = comparison_rows(runs)
    if rows:
        env.print0("\nper-rank bytes (rank 0) and collectives of one step, time per step:")
        env.print0(table(rows))
    timed = [r for r in runs if r.get("compiled") or r.get("compile_error")]
    if timed:
        env.print0("\ncompiled runs (no instruments on them):")
        env.print0(table([{"run": r["label"], "first step ms": round(r.get("first_step_ms", 0)),
                           "ms/step": round(r.get("ms_per_step", 0)),
                           "graphs": r.get("compiled", {}).get("unique_graphs", "-"),
                           "ops in graphs": r.get("compiled", {}).get("ops_captured", "-"),
                           "graph breaks": r.get("compiled", {}).get("graph_breaks", "-"),
                           "error": (r.get("compile_error") or "")[:60]} for r in timed]))


def build_classic(cfg, env, reference):
    """Lesson 1's setup (``--api classic``): FullyShardedDataParallel with one unit per Block."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    return FSDP(copy.deepcopy(reference),
                auto_wrap_policy=functools.partial(transformer_auto_wrap_policy,
                                                   transformer_layer_cls={Block}),
                # FULL_SHARD reshards every unit but the root: FSDP2's default (None)
                sharding_strategy=ShardingStrategy.SHARD_GRAD_OP
                if cfg.reshard_after_forward is False else ShardingStrategy.FULL_SHARD,
                mixed_precision=MixedPrecision(param_dtype=torch.bfloat16,
                                               reduce_dtype=torch.float32)
                if cfg.mixed_precision else None,
                device_id=env.device)  # required on CPU too, else FSDP looks for a GPU


def save_metrics(cfg, env, results) -> None:
    """The metrics file: every run, and the history of the last run that has one (a run the
    compiler stopped has none)."""
    history = next((run["history"] for run in reversed(results) if run["history"]), [])
    write_metrics(cfg.metrics, "lesson5", env, cfg, history, {"runs": results})
