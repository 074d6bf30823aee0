"""Lesson 4: checkpointing a sharded model (classic FSDP) without losing work.

Trains the course GPT with every block its own FSDP unit and saves a checkpoint every
--ckpt-every steps with torch.distributed.checkpoint (DCP): each rank writes its own shards into
a temporary directory that is renamed into place only when every rank is done. After a restart
it resumes from the newest checkpoint (model, optimizer, step = data position, RNG). At the end
it trains the same model twice more in this process, restored from the oldest checkpoint and
uninterrupted from scratch, and checks all three end bitwise identical.

    bash launch/lesson4.sh                               # 8 steps, a checkpoint every 4, compare
    bash launch/lesson4.sh --crash-at-step 5             # rank N-1 is killed once; restart, resume
    bash launch/lesson4.sh --crash-at-step 8 --crash-in save    # killed half-way through a save
    bash launch/lesson4.sh --demo torch-save,types       # what torch.save writes; state-dict types
    COURSE_TIMEOUT_S=5 bash launch/lesson4.sh --bug rank0-only  # state_dict() on rank 0 only: hangs
    NPROC=4 bash launch/lesson4.sh --save runs/lesson4/dcp4     # save on 4 ranks ...
    NPROC=2 bash launch/lesson4.sh --load runs/lesson4/dcp4     # ... load on 2, checked equal
    NPROC=3 bash launch/lesson4.sh --load DIR --ckpt-module solutions/lesson4_dcp_save_load.py

A fresh run (not --resume, not a restart) first deletes the checkpoints in --ckpt-dir.
"""

import functools
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the lesson's own state_dicts.py
import state_dicts  # noqa: E402

from fsdp_course import checkpoint as ckpt  # noqa: E402
from fsdp_course.config import TrainConfig, describe, parse_config  # noqa: E402
from fsdp_course.data import load_data  # noqa: E402
from fsdp_course.dist import CourseError, distributed, mean_over_ranks  # noqa: E402
from fsdp_course.measure import MiB, CommCounter, state_bytes  # noqa: E402
from fsdp_course.model import GPT, Block, lm_loss  # noqa: E402
from fsdp_course.report import MetricLogger, write_json_atomic, write_metrics  # noqa: E402

DEMOS = ("torch-save", "types")


@dataclass
class Config(TrainConfig):
    steps: int = field(default=8, metadata={"help": "train until this step (a total, also after a resume)"})
    d_model: int = 64  # a smaller model than lessons 1-3: here the saves and loads are the point
    n_layers: int = 2
    log_every: int = 2
    ckpt_every: int = field(default=4, metadata={"help": "checkpoint every N steps (0: never)"})
    ckpt_dir: str = field(default="runs/lesson4/ckpt", metadata={"help": "where checkpoints go"})
    keep: int = field(default=2, metadata={"help": "keep the newest N checkpoints"})
    resume: bool = field(default=False, metadata={"help": "resume from the newest checkpoint (automatic after a restart)"})
    crash_at_step: int | None = field(default=None, metadata={"help": "kill the last rank once at this step (needs MAX_RESTARTS>=1)"})
    crash_in: str = field(default="step", metadata={"choices": ("step", "save"), "help": "step: before the step; save: during the first save at or after it"})
    compare: bool = field(default=True, metadata={"help": "also train restored and uninterrupted copies and compare"})
    save: str | None = field(default=None, metadata={"help": "after training, save a DCP checkpoint here"})
    load: str | None = field(default=None, metadata={"help": "load this DCP checkpoint first (any world size)"})
    ckpt_module: str | None = field(default=None, metadata={"help": "a .py file with save(path, model, optimizer) and load(path, model, optimizer) for --save/--load"})
    demo: str | None = field(default=None, metadata={"help": f"after training: {', '.join(DEMOS)} (comma-separated)"})
    bug: str | None = field(default=None, metadata={"choices": ("rank0-only",), "help": "rank0-only: call state_dict() on rank 0 only"})


def build(cfg, env, data, seed):
    # --- model / shard / optimizer: the same for the run, its restored copy and the reference --
    torch.manual_seed(seed)
    model = GPT(cfg.model_config(data.vocab_size))
    model = FSDP(model, device_id=env.device, auto_wrap_policy=functools.partial(
        transformer_auto_wrap_policy, transformer_layer_cls={Block}))
    return model, torch.optim.AdamW(model.parameters(), lr=cfg.lr)


def train_step(model, optimizer, data, env, cfg, step) -> tuple[float, int]:
    # data.batch is a function of the step: the step is the data position.
    x, y = data.batch(step, env.rank, env.world_size, cfg.batch_size, cfg.seq_len, env.device)
    loss = lm_loss(model(x), y)
    loss.backward()
    optimizer.step()
    held = sum(state_bytes(model, optimizer).values())  # sharded params + grads + Adam state
    optimizer.zero_grad(set_to_none=True)
    return mean_over_ranks(loss), held


def save_checkpoint(path, model, optimizer, step, env, crash=False):
    """DCP: every rank writes only its own shards, in parallel; nobody gathers the model."""
    model_sd, optim_sd = get_state_dict(model, optimizer)  # sharded views (ShardedTensor), no copy
    state = {"model": model_sd, "optim": optim_sd,
             "trainer": {"step": step, "rng": torch.get_rng_state()}}
    with ckpt.atomic_dir(path, env.is_rank0) as tmp:  # .tmp-step_N, renamed once all are done
        writer = ckpt.CrashingWriter(tmp) if crash else dcp.FileSystemWriter(tmp)
        dcp.save(state, storage_writer=writer)


def load_checkpoint(path, model, optimizer) -> int:
    """The same structure as the save, sharded as *this* run is: DCP reads the slices it needs."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd,
             "trainer": {"step": 0, "rng": torch.get_rng_state()}}
    ckpt.check_loadable(path, {f"model.{k}": list(v.shape) for k, v in model_sd.items()})
    dcp.load(state, checkpoint_id=path)  # fills model_sd / optim_sd in place
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    torch.set_rng_state(state["trainer"]["rng"])
    return state["trainer"]["step"]


def timed(fn, *args):
    start = time.perf_counter()
    out = fn(*args)
    return out, round((time.perf_counter() - start) * 1e3, 1)


def main() -> None:
    cfg = parse_config(Config, __doc__)
    with distributed(seed=cfg.seed) as env:
        # --- setup -------------------------------------------------------------------------
        ckpt.quiet_state_dict_warnings()  # torch-internal deprecation notes, repeated per call
        restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        demos = [d.strip() for d in (cfg.demo or "").split(",") if d.strip()]
        if any(d not in DEMOS for d in demos):
            raise CourseError(f"--demo {cfg.demo}: choose from {', '.join(DEMOS)}")
        periodic = not (cfg.save or cfg.load or demos or cfg.bug) and cfg.ckpt_every > 0
        if cfg.crash_at_step is not None:
            if not periodic:
                raise CourseError("--crash-at-step needs periodic checkpoints (not with --save/--load/--demo/--bug, --ckpt-every > 0)")
            if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) < 1:
                raise CourseError("--crash-at-step kills a rank: allow a restart, e.g. MAX_RESTARTS=1 bash launch/lesson4.sh --crash-at-step 5")
        if cfg.ckpt_module and not (cfg.save or cfg.load):
            raise CourseError("--ckpt-module is used by --save / --load: give one of them")
        module = ckpt.load_module(cfg.ckpt_module) if cfg.ckpt_module else None
        save_fn = module.save if module else functools.partial(save_checkpoint, step=cfg.steps, env=env)
        load_fn = module.load if module else load_checkpoint
        env.print0(f"lesson 4 | {env.world_size} ranks | {env.backend} on {env.device.type} | "
                   f"attempt {restart} | {describe(cfg)}")
        data = load_data(cfg.data, seed=cfg.seed)
        root = Path(cfg.ckpt_dir)
        results = {"restart_count": restart, "saves": []}
        model, optimizer = build(cfg, env, data, cfg.seed)

        # --- checkpoint: where does this run start? ------------------------------------------
        start = 0
        if cfg.load:
            step, results["load_ms"] = timed(load_fn, cfg.load, model, optimizer)
            start = step if isinstance(step, int) else cfg.steps  # a learner's load may not say
            results["loaded"] = ckpt.fingerprint(model, optimizer)
            saved = Path(cfg.load) / ckpt.FINGERPRINT
            if saved.is_file():
                results["equal_to_saved"] = ckpt.compare_fingerprints(ckpt.read_json(saved), results["loaded"])
                env.print0(f"loaded {cfg.load} on {env.world_size} ranks: equal to the saved model "
                           f"and optimizer: {results['equal_to_saved']['equal']}")
        elif periodic and (restart > 0 or cfg.resume):
            results["partial_found"] = [{"dir": p.name, "files": [f["file"] for f in ckpt.list_files(p)]}
                                        for p in ckpt.partial(root)]
            newest = ckpt.latest(root)
            if newest is not None:
                start, results["load_ms"] = timed(load_checkpoint, newest, model, optimizer)
                env.print0(f"resumed from {newest} (step {start}); ignored half-written: "
                           f"{[p['dir'] for p in results['partial_found']] or 'none'}")
            results["resumed_from"] = start
        elif periodic and env.is_rank0:  # a fresh run: old checkpoints would be resumed by mistake
            for old in ckpt.published(root) + ckpt.partial(root):
                shutil.rmtree(old)

        # --- loop ----------------------------------------------------------------------------
        logger = MetricLogger(env, cfg.log_every)
        victim = restart == 0 and env.rank == env.world_size - 1 and cfg.crash_at_step is not None
        for step in range(start, cfg.steps):
            if victim and cfg.crash_in == "step" and step == cfg.crash_at_step:
                print(f"[rank {env.rank}] simulated crash at step {step}: SIGKILL", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            with CommCounter() as comm:
                (loss, held), ms = timed(train_step, model, optimizer, data, env, cfg, step)
            logger.log(step, loss, ms, held / MiB, comm.total_bytes / MiB, last=step == cfg.steps - 1)
            if periodic and (step + 1) % cfg.ckpt_every == 0:
                crash = victim and cfg.crash_in == "save" and step + 1 >= cfg.crash_at_step
                if crash:
                    print(f"[rank {env.rank}] simulated crash while saving step {step + 1}", flush=True)
                _, ms = timed(save_checkpoint, ckpt.step_dir(root, step + 1), model, optimizer, step + 1, env, crash)
                results["saves"].append({"step": step + 1, "ms": ms, "files": ckpt.list_files(ckpt.step_dir(root, step + 1))})
                if env.is_rank0:
                    ckpt.prune(root, cfg.keep)

        # --- checkpoint (end of training) ----------------------------------------------------
        if cfg.bug == "rank0-only":
            # WRONG: state_dict() all-gathers every FSDP unit, a collective all ranks must join.
            env.print0("rank 0 calls model.state_dict() alone; the others wait at a barrier ...")
            if env.is_rank0:
                torch.save(model.state_dict(), root / "rank0_only.pt")
            dist.barrier()  # rank 0 never gets here: it waits for the others in its all-gather
        if "torch-save" in demos:
            results["torch_save"] = state_dicts.torch_save_pitfall(model, optimizer, env, root / "torch_save")
        if "types" in demos:
            results["types"] = state_dicts.compare_types(
                model, optimizer, env, root / "types", lambda: build(cfg, env, data, cfg.seed + 1))
        if cfg.save:
            _, results["save_ms"] = timed(save_fn, cfg.save, model, optimizer)
            results["saved"] = ckpt.fingerprint(model, optimizer)
            dist.barrier()
            if env.is_rank0:
                write_json_atomic(Path(cfg.save) / ckpt.FINGERPRINT, results["saved"])
            results["save_files"] = ckpt.list_files(cfg.save)
            env.print0(f"saved {cfg.save} from {env.world_size} ranks in {results['save_ms']} ms: "
                       f"{len(results['save_files'])} files, {sum(f['bytes'] for f in results['save_files']):,} bytes")

        # --- report: the run against a restored copy and an uninterrupted one -----------------
        if periodic and cfg.compare:
            results["final"] = final = ckpt.fingerprint(model, optimizer)
            oldest = ckpt.published(root)[0]
            for name, seed, source in (("restored", cfg.seed + 1, oldest), ("uninterrupted", cfg.seed, None)):
                # seed + 1: a different init, so the load has to overwrite every tensor
                copy, copy_optimizer = build(cfg, env, data, seed)
                first = load_checkpoint(source, copy, copy_optimizer) if source else 0
                for step in range(first, cfg.steps):
                    train_step(copy, copy_optimizer, data, env, cfg, step)
                results[f"equal_{name}"] = {"from_step": first, **ckpt.compare_fingerprints(
                    final, ckpt.fingerprint(copy, copy_optimizer))}
                env.print0(f"{name:>13} copy (from step {first}) ends bitwise equal: "
                           f"{results[f'equal_{name}']['equal']}")
            results["checkpoint_files"] = ckpt.list_files(ckpt.latest(root))
        write_metrics(cfg.metrics, "lesson4", env, cfg, logger.history, results)


if __name__ == "__main__":
    main()
