"""Lesson 0: torchrun, process groups, and the DDP baseline.

torchrun starts one process per rank and tells each who it is through environment variables.
This script shows what it set, trains the course's small GPT with DistributedDataParallel, and
measures the baseline FSDP improves on: every rank holds a full replica of parameters,
gradients and optimizer state, and all-reduces every gradient byte each step.

    bash launch/lesson0.sh                       # 2 CPU ranks (or one per GPU)
    NPROC=4 bash launch/lesson0.sh --steps 10 --metrics runs/ddp.json
    torchrun --standalone --nproc-per-node=2 lessons/00_torchrun_ddp/train.py   # the same
    python lessons/00_torchrun_ddp/train.py      # the mistake: no torchrun, no process group
"""

import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from fsdp_course import theory
from fsdp_course.config import TrainConfig, describe, parse_config
from fsdp_course.data import load_data
from fsdp_course.dist import distributed, mean_over_ranks
from fsdp_course.measure import CommCounter, MiB, activation_bytes, state_bytes
from fsdp_course.model import GPT, lm_loss, num_params
from fsdp_course.report import MetricLogger, table, write_metrics
from timeouts import collective_timeouts

TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT")


def main() -> None:
    cfg = parse_config(TrainConfig, __doc__)  # lesson 0 needs only the shared flags
    with distributed(seed=cfg.seed) as env:
        # --- setup: what torchrun told each process --------------------------------------
        mine = {name: os.environ.get(name, "") for name in TORCHRUN_VARS}
        mine.update(pid=os.getpid(), host=socket.gethostname(), device=str(env.device))
        everyone = [None] * env.world_size
        dist.all_gather_object(everyone, mine)  # a collective: every rank must call it
        env.print0(f"lesson 0 | {env.world_size} ranks | {env.backend} on {env.device.type} | "
                   f"{describe(cfg)}")
        env.print0("\nwhat torchrun set in each process:")
        env.print0(table(everyone))
        # Every rank must join every collective; one that never comes leaves the others waiting
        # until the group's timeout. This course sets COURSE_TIMEOUT_S; PyTorch's defaults differ.
        timeouts = collective_timeouts(env.device)
        env.print0(f"\ncollective timeout: this job {timeouts['this_job_s']:g} s "
                   "(COURSE_TIMEOUT_S); "
                   f"PyTorch's default: gloo {timeouts['gloo_default_s']:g} s, "
                   f"NCCL {timeouts['nccl_default_s'] or float('nan'):g} s")

        # --- model: the same seed on every rank gives the same initial weights -------------
        data = load_data(cfg.data, seed=cfg.seed)
        model = GPT(cfg.model_config(data.vocab_size))
        reference = GPT(model.cfg)  # single-process copy, to check DDP's gradients against
        reference.load_state_dict(model.state_dict())
        model.to(env.device)
        count = num_params(model)

        # --- wrap: DDP keeps a full replica and all-reduces gradients in buckets -----------
        model = DDP(model, device_ids=[env.device.index] if env.device.type == "cuda" else None)
        comm = CommCounter()
        model.register_comm_hook(None, comm.ddp_comm_hook)  # count each bucket, then all-reduce

        # --- optimizer ---------------------------------------------------------------------
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)

        # --- loop --------------------------------------------------------------------------
        logger = MetricLogger(env, cfg.log_every)
        grad_diff = None
        for step in range(cfg.steps):
            x, y = data.batch(step, env.rank, env.world_size, cfg.batch_size, cfg.seq_len,
                              env.device)
            comm.reset()
            start = time.perf_counter()
            with activation_bytes(model) as activations:
                loss = lm_loss(model(x), y)
            loss.backward()  # DDP all-reduces (averages) gradients during backward
            measured = state_bytes(model, optimizer)
            if step == 0:
                grad_diff = check_against_reference(model, reference, data, cfg, env)
                buckets = comm.ddp_bucket_memory(model)  # DDP's second copy of the gradients
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            ms = (time.perf_counter() - start) * 1e3
            peak = sum(measured.values()) + activations["bytes"]
            logger.log(step, mean_over_ranks(loss), ms, peak / MiB, comm.total_bytes / MiB,
                       last=step == cfg.steps - 1)

        # --- report: measured next to theory ---------------------------------------------
        measured["activations"] = activations["bytes"]
        expected = theory.ddp_state_bytes(count)
        comm_expected = {"all_reduce": 4 * count} if env.world_size > 1 else {}
        env.print0("\nDDP gradients vs one process on the global batch: max |diff| = "
                   f"{grad_diff:.2e}")
        env.print0("\nper-rank bytes (a full replica on every rank, whatever the world size):")
        env.print0(table([{"category": k, "measured": v, "theory": expected.get(k, "-"),
                           "MiB": round(v / MiB, 3)} for k, v in measured.items()]))
        env.print0("\ncollectives in the last step (payload bytes):")
        env.print0(table([{"collective": k, "calls": v["calls"], "bytes": v["bytes"],
                           "theory": comm_expected.get(k, 0)} for k, v in comm.summary().items()]
                         or [{"collective": "(none: one rank has nobody to talk to)"}]))
        env.print0(f"DDP's gradient buckets: {buckets['bytes']:,} bytes beside the gradients "
                   f"({buckets['grads_inside']} of {buckets['grads']} gradients inside them; "
                   "gradient_as_bucket_view=True would put them all there)")
        results = {
            "torchrun_env": everyone, "num_params": count, "timeouts": timeouts,
            "bytes": measured, "bytes_theory": expected,
            "collectives": comm.summary(), "collectives_theory": comm_expected,
            "grad_max_diff_vs_reference": grad_diff, "ddp_buckets": buckets,
            "ms_per_step": statistics.median(row["ms"] for row in logger.history),
            "loss_first": logger.history[0]["loss"], "loss_last": logger.history[-1]["loss"],
        }
        if env.device.type == "cuda":
            results["cuda_max_allocated"] = torch.cuda.max_memory_allocated(env.device)
        write_metrics(cfg.metrics, "lesson0", env, cfg, logger.history, results)


def check_against_reference(model, reference, data, cfg, env) -> float:
    """Largest difference between DDP's averaged gradients and the gradients one process gets
    on the whole global batch (every rank's rows together): DDP is exact up to float rounding."""
    x, y = data.batch(0, 0, 1, cfg.batch_size * env.world_size, cfg.seq_len)
    lm_loss(reference(x), y).backward()
    return max((p.grad.cpu() - r.grad).abs().max().item()
               for p, r in zip(model.module.parameters(), reference.parameters()))


if __name__ == "__main__":
    main()
