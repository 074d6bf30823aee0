"""Lesson 4's runs (what train.py needs but the lesson is not about): its flags (Config) and
their checks, timings, and the bitwise comparisons it reports (imported by train.py)."""

import functools
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed as dist

from fsdp_course import checkpoint as ckpt
from fsdp_course.config import TrainConfig, int_at_least, list_flag, list_help
from fsdp_course.dist import CourseError
from fsdp_course.learner import load_learner
from fsdp_course.report import write_json_atomic

DEMOS = ("torch-save", "types", "rng")


@dataclass
class Config(TrainConfig):
    steps: int = field(default=8, metadata={
        "help": "train until this step (a total, also after a resume)"})
    d_model: int = 64  # a smaller model than lessons 1-3: here the saves and loads are the point
    n_layers: int = 2
    log_every: int = 2
    ckpt_every: int = field(default=4, metadata={"help": "checkpoint every N steps (0: never)"})
    ckpt_dir: str = field(default="runs/lesson4/ckpt", metadata={"help": "where checkpoints go"})
    keep: int = field(default=2, metadata={"parse": int_at_least(1),
        "help": "keep the newest N checkpoints (at least 1: a resume needs the newest)"})
    resume: bool = field(default=False, metadata={
        "help": "resume from the newest checkpoint (automatic after a restart)"})
    crash_at_step: int | None = field(default=None, metadata={
        "help": "kill the last rank once at this step (needs MAX_RESTARTS>=1)"})
    crash_in: str = field(default="step", metadata={"choices": ("step", "save"),
        "help": "step: before the step; save: during the first save at or after it"})
    rng: str = field(default="shared", metadata={"choices": ("shared", "per-rank"),
        "help": "per-rank: each rank reseeds after the build (its own dropout masks, say)"})
    save: str | None = field(default=None, metadata={
        "help": "after training, save a DCP checkpoint here"})
    reload: bool = field(default=False, metadata={
        "help": "after --save, load it into a fresh model (another init and RNG) and compare"})
    load: str | None = field(default=None, metadata={
        "help": "load this DCP checkpoint first (any world size)"})
    ckpt_module: str | None = field(default=None, metadata={
        "help": "a .py file with save(path, model, optimizer) and load(path, model, optimizer) "
                "for --save/--load"})
    demo: tuple[str, ...] = field(default=(), metadata={
        "parse": list_flag("Demos", DEMOS), "help": list_help("after training", DEMOS)})
    bug: str | None = field(default=None, metadata={"choices": ("rank0-only", "offload-cpu"),
        "help": "rank0-only: state_dict() on rank 0 only; "
                "offload-cpu: offload_to_cpu=True on CPU ranks"})


def periodic_checkpoints(cfg) -> bool:
    """Does this run checkpoint every --ckpt-every steps? Checks the flags that depend on it."""
    periodic = not (cfg.save or cfg.load or cfg.bug) and cfg.ckpt_every > 0
    if cfg.crash_at_step is not None:
        if not periodic:
            raise CourseError("--crash-at-step needs periodic checkpoints (not with "
                              "--save/--load/--bug, --ckpt-every > 0)")
        if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) < 1:
            raise CourseError("--crash-at-step kills a rank: allow a restart, e.g. MAX_RESTARTS=1 "
                              "bash launch/lesson4.sh --crash-at-step 5")
    if cfg.ckpt_module and not cfg.save and not cfg.load:
        raise CourseError("--ckpt-module is used by --save / --load: give one of them")
    if cfg.reload and not cfg.save:
        raise CourseError("--reload loads what --save wrote: give --save DIR")
    return periodic


def checkpoint_functions(cfg, save_checkpoint, load_checkpoint, env):
    """(save, load): the script's own, or the ones a --ckpt-module file defines (the exercise)."""
    if cfg.ckpt_module:
        module = load_learner(cfg.ckpt_module, "--ckpt-module", "save(path, model, optimizer)",
                              "load(path, model, optimizer)")
        return module.save, module.load
    return functools.partial(save_checkpoint, step=cfg.steps, env=env), load_checkpoint


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, round((time.perf_counter() - start) * 1e3, 1)


def resume_newest(root, load_checkpoint, model, optimizer, env) -> tuple[int, dict]:
    """After a restart (or --resume): load the newest published checkpoint under ``root``; the
    half-written ``.tmp-*`` directories a killed save left are listed, never loaded."""
    found = {"partial_found": [{"dir": p.name, "files": [f["file"] for f in ckpt.list_files(p)]}
                               for p in ckpt.partial(root)], "resumed_from": 0}
    newest = ckpt.latest(root)
    if newest is not None:
        found["resumed_from"], found["load_ms"] = timed(load_checkpoint, newest, model, optimizer)
        env.print0(f"resumed from {newest} (step {found['resumed_from']}); ignored half-written: "
                   f"{[p['dir'] for p in found['partial_found']] or 'none'}")
    return found["resumed_from"], found


def model_and_optimizer(prints: dict) -> dict:
    """A fingerprint without the per-rank RNG entries: what must survive a change of world size."""
    return {k: v for k, v in prints.items() if not k.startswith("rng.")}


def publish_fingerprint(path, prints: dict, env) -> None:
    """Next to a --save checkpoint, for a later --load (on any world size) to compare with."""
    dist.barrier()
    if env.is_rank0:
        write_json_atomic(Path(path) / ckpt.FINGERPRINT, model_and_optimizer(prints))


def against_saved(path, model, optimizer, env) -> tuple[dict, dict | None]:
    """The loaded model and optimizer's fingerprint, and how it compares with the one the --save
    run published (None when there is none: a checkpoint written by something else)."""
    loaded = ckpt.fingerprint(model, optimizer)
    saved = Path(path) / ckpt.FINGERPRINT
    if not saved.is_file():
        return loaded, None
    verdict = ckpt.compare_fingerprints(ckpt.read_json(saved), loaded)
    env.print0(f"loaded {path} on {env.world_size} ranks: equal to the saved model and optimizer: "
               f"{verdict['equal']}")
    return loaded, verdict


def save_and_reload(cfg, save_fn, load_fn, model, optimizer, build_copy, env) -> dict:
    """--save DIR with save_fn (the script's or --ckpt-module's), its fingerprint published for
    a later --load; with --reload, load_fn into build_copy()'s fresh model, compared bitwise."""
    _, save_ms = timed(save_fn, cfg.save, model, optimizer)
    saved = ckpt.fingerprint(model, optimizer, rng=True)
    publish_fingerprint(cfg.save, saved, env)
    files = ckpt.list_files(cfg.save)
    env.print0(f"saved {cfg.save} from {env.world_size} ranks in {save_ms} ms: "
               f"{len(files)} files, {sum(f['bytes'] for f in files):,} bytes")
    out = {"save_ms": save_ms, "saved": saved, "save_files": files}
    if cfg.reload:
        copy, copy_optimizer = build_copy()
        load_fn(cfg.save, copy, copy_optimizer)
        out["reloaded"] = ckpt.fingerprint(copy, copy_optimizer, rng=True)
        out["equal_reloaded"] = ckpt.compare_fingerprints(saved, out["reloaded"])
        env.print0("loaded back into a fresh model, bitwise equal (RNG included): "
                   f"{out['equal_reloaded']}")
    return out
