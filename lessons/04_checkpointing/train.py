"""Lesson 4: checkpointing a sharded model (classic FSDP) without losing work.

Trains the course GPT (every block an FSDP unit) and checkpoints every --ckpt-every steps with
torch.distributed.checkpoint (DCP), into a temporary directory renamed into place once every
rank is done. A fresh run first deletes the checkpoints in --ckpt-dir; a restart (or --resume)
resumes from the newest one (model, optimizer, step = data position, RNG). Then two copies,
restored from the oldest checkpoint and uninterrupted from scratch, are trained here too: all
three must end bitwise identical (RNG states included).

    bash launch/lesson4.sh                               # 8 steps, a checkpoint every 4, compare
    bash launch/lesson4.sh --demo torch-save,types,rng   # ... and what each state dict holds
    bash launch/lesson4.sh --rng per-rank                # a seed per rank: still bitwise?
    bash launch/lesson4.sh --crash-at-step 5             # rank N-1 is killed once; restart, resume
    bash launch/lesson4.sh --crash-at-step 8 --crash-in save    # killed half-way through a save
    COURSE_TIMEOUT_S=2 bash launch/lesson4.sh --bug rank0-only  # state_dict() on rank 0 only: hangs
    bash launch/lesson4.sh --bug offload-cpu             # classic offload_to_cpu on CPU ranks
    NPROC=2 bash launch/lesson4.sh --save runs/lesson4/dcp2     # save on 2 ranks ...
    NPROC=3 bash launch/lesson4.sh --load runs/lesson4/dcp2     # ... load on 3, checked equal
    bash launch/lesson4.sh --save DIR --reload --rng per-rank \
        --ckpt-module solutions/lesson4_dcp_save_load.py
"""

import functools
import os
import shutil
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

import pitfalls  # lesson 4's own modules, next to this script (each docstring says what it holds)
import runs
import state_dicts
from fsdp_course import checkpoint as ckpt
from fsdp_course.config import describe, parse_config
from fsdp_course.data import load_data
from fsdp_course.dist import distributed, mean_over_ranks, say
from fsdp_course.measure import CommCounter, MiB, state_bytes
from fsdp_course.model import GPT, Block, lm_loss
from fsdp_course.report import MetricLogger, write_metrics
from runs import Config  # the flags (argument code, not the lesson)


def build(cfg, env, data, seed):
    # --- model / shard / optimizer: the same for the run, its restored copy and the reference --
    torch.manual_seed(seed)
    model = GPT(cfg.model_config(data.vocab_size))
    model = FSDP(model, device_id=env.device, auto_wrap_policy=functools.partial(
        transformer_auto_wrap_policy, transformer_layer_cls={Block}))
    if cfg.rng == "per-rank":  # the same init everywhere, then a random stream per rank
        torch.manual_seed(1000 * seed + env.rank)
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
    """DCP: every rank writes only its own part, in parallel. For classic FSDP get_state_dict
    all-gathers each unit for a moment to cut it into per-parameter chunks; FSDP2 gathers
    nothing."""
    model_sd, optim_sd = get_state_dict(model, optimizer)  # ShardedTensors (FSDP2: DTensors)
    # The RNG state is a plain tensor, the same key on every rank: DCP keeps ONE copy of it.
    # (The CPU generator; on GPUs dropout draws from torch.cuda.get_rng_state()'s, save it too.)
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
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    torch.set_rng_state(state["trainer"]["rng"])
    return state["trainer"]["step"]


def main() -> None:
    cfg = parse_config(Config, __doc__)
    with distributed(seed=cfg.seed) as env:
        # --- setup -------------------------------------------------------------------------
        ckpt.quiet_state_dict_warnings()  # repeated per call; --demo types shows one, explained
        restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        periodic = runs.periodic_checkpoints(cfg)  # and the flags that need it, checked
        save_fn, load_fn = runs.checkpoint_functions(cfg, save_checkpoint, load_checkpoint, env)
        env.print0(f"lesson 4 | {env.world_size} ranks | {env.backend} | attempt {restart} | "
                   f"{describe(cfg)}")
        data = load_data(cfg.data, seed=cfg.seed)
        root = Path(cfg.ckpt_dir)
        results = {"restart_count": restart, "saves": []}
        model, optimizer = build(cfg, env, data, cfg.seed)

        # --- checkpoint: where does this run start? ------------------------------------------
        start = 0
        if cfg.load:
            step, results["load_ms"] = runs.timed(load_fn, cfg.load, model, optimizer)
            start = step if isinstance(step, int) else cfg.steps  # a learner's load may not say
            results["loaded"], results["equal_to_saved"] = runs.against_saved(cfg.load, model,
                                                                              optimizer, env)
        elif periodic and (restart > 0 or cfg.resume):  # the newest published one; .tmp-* never
            start, resumed = runs.resume_newest(root, load_checkpoint, model, optimizer, env)
            results.update(resumed)
        elif periodic and env.is_rank0:  # a fresh run: old checkpoints would be resumed by mistake
            for old in ckpt.published(root) + ckpt.partial(root):
                shutil.rmtree(old)

        # --- loop ----------------------------------------------------------------------------
        logger = MetricLogger(env, cfg.log_every)
        victim = restart == 0 and env.rank == env.world_size - 1 and cfg.crash_at_step is not None
        for step in range(start, cfg.steps):
            if victim and cfg.crash_in == "step" and step == cfg.crash_at_step:
                say(f"[rank {env.rank}] simulated crash at step {step}: SIGKILL", sys.stdout)
                os.kill(os.getpid(), signal.SIGKILL)
            with CommCounter() as comm:
                (loss, held), ms = runs.timed(train_step, model, optimizer, data, env, cfg, step)
            logger.log(step, loss, ms, held / MiB, comm.total_bytes / MiB,
                       last=step == cfg.steps - 1)
            if periodic and (step + 1) % cfg.ckpt_every == 0:
                crash = victim and cfg.crash_in == "save" and step + 1 >= cfg.crash_at_step
                path = ckpt.step_dir(root, step + 1)
                _, ms = runs.timed(save_checkpoint, path, model, optimizer, step + 1, env, crash)
                results["saves"].append({"step": step + 1, "ms": ms,
                                         "files": ckpt.list_files(path)})
                if env.is_rank0:
                    ckpt.prune(root, cfg.keep)

        # --- checkpoint (end of training) ----------------------------------------------------
        if cfg.bug == "rank0-only":
            # WRONG: state_dict() all-gathers every FSDP unit, a collective all ranks must join.
            env.print0("rank 0 calls model.state_dict() alone; the others wait at a barrier ...")
            if env.is_rank0:
                torch.save(model.state_dict(), root / "rank0_only.pt")
            dist.barrier()  # rank 0 never gets here: it waits for the others in its all-gather
        if cfg.bug == "offload-cpu":
            # WRONG on CPU ranks: the tensors are in CPU memory already, and the offload path fails.
            with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT,
                                      FullStateDictConfig(offload_to_cpu=True, rank0_only=True)):
                model.state_dict()
        build_copy = functools.partial(build, cfg, env, data, cfg.seed + 1)  # another init and RNG
        with torch.random.fork_rng(devices=[]):  # the demos build (and seed) models of their own
            if "torch-save" in cfg.demo:  # classic FSDP, and an FSDP2 model of the same GPT
                results["torch_save"] = pitfalls.torch_save_pitfall(model, optimizer, env,
                                                                    root / "torch_save")
            if "types" in cfg.demo:
                results["types"] = state_dicts.compare_types(model, optimizer, env, root / "types",
                                                             build_copy)
            if "rng" in cfg.demo:
                results["rng"] = pitfalls.rng_dedup(model, optimizer, env, root / "rng", save_fn,
                                                    load_fn, build_copy)
        if cfg.save:  # then --reload: into a fresh model, compared bitwise, RNG included
            results.update(runs.save_and_reload(cfg, save_fn, load_fn, model, optimizer, build_copy,
                                                env))

        # --- report: the run against a restored copy and an uninterrupted one -----------------
        if periodic:
            results["final"] = final = ckpt.fingerprint(model, optimizer, rng=True)
            oldest = ckpt.published(root)[0]  # restored with seed + 1: the load must overwrite all
            for name, seed, source in (("restored", cfg.seed + 1, oldest),
                                       ("uninterrupted", cfg.seed, None)):
                copy, copy_optimizer = build(cfg, env, data, seed)
                first = load_checkpoint(source, copy, copy_optimizer) if source else 0
                for step in range(first, cfg.steps):
                    train_step(copy, copy_optimizer, data, env, cfg, step)
                copied = ckpt.fingerprint(copy, copy_optimizer, rng=True)
                verdict = results[f"equal_{name}"] = {"from_step": first,
                                                      **ckpt.compare_fingerprints(final, copied)}
                env.print0(f"{name:>13} copy (from step {first}) ends bitwise equal: "
                           f"{verdict['equal']} {verdict['different'] or ''}")
            results["checkpoint_files"] = ckpt.list_files(ckpt.latest(root))
        write_metrics(cfg.metrics, "lesson4", env, cfg, logger.history, results)


if __name__ == "__main__":
    main()
