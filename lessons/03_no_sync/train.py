"""Lesson 3: gradient accumulation with FSDP, and what no_sync() saves and costs.

Each optimizer step runs K micro-batches; only the last must reduce-scatter gradients, the
others run in ``model.no_sync()`` (classic FSDP) or with ``set_requires_gradient_sync(False)``
(FSDP2) and keep *unsharded* gradients. Measured in step 0: the gradient against one process that
ran every rank's micro-batches as one batch, each collective's bytes, the gradients held between.

    bash launch/lesson3.sh --accum 4                       # no_sync on micro-batches 1..K-1
    bash launch/lesson3.sh --accum 4 --no-sync off         # reduce-scatter every micro-batch
    bash launch/lesson3.sh --accum 4 --bug no-sync-last    # the pitfall: no_sync on all K
    bash launch/lesson3.sh --accum 4 --api fsdp1,fsdp2     # FSDP2's set_requires_gradient_sync
    bash launch/lesson3.sh --accum 4 --last-batch-size 1   # a short last micro-batch (0,1: both)
    bash launch/lesson3.sh --accum 1,2,4,8 --variants "api=fsdp2,accum=4;accum=4,bug=no-sync-last"
    bash launch/lesson3.sh --accum 4 --loop-file my_loop.py   # your accumulate(), checked
"""

import functools
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

import accumulation  # this lesson's measurements: bytes held, the one-big-batch reference
from fsdp_course import theory
from fsdp_course.config import TrainConfig, describe, parse_config, parse_variants
from fsdp_course.data import load_data
from fsdp_course.dist import distributed, mean_over_ranks
from fsdp_course.learner import load_learner
from fsdp_course.measure import CommCounter, MiB, state_bytes
from fsdp_course.model import GPT, Block, lm_loss
from fsdp_course.report import MetricLogger, write_metrics
from runs import (
    VARIANTS_HELP,
    Apis,
    Bugs,
    Counts,
    Sizes,
    Switches,
    planned_runs,
    print_header,
    print_summary,
    report_run,
)


@dataclass
class Config(TrainConfig):
    accum: Counts = field(default=Counts("4"), metadata={
        "help": "micro-batches per optimizer step (K): " + Counts.expected})
    no_sync: Switches = field(default=Switches("on"), metadata={"help": "on: no gradient sync "
        "but on the last micro-batch; off: sync every one; on,off: both"})
    api: Apis = field(default=Apis("fsdp1"), metadata={"help": "fsdp1 (FullyShardedDataParallel "
        "+ no_sync), fsdp2 (fully_shard + set_requires_gradient_sync), or fsdp1,fsdp2"})
    bug: Bugs = field(default=Bugs("none"), metadata={
        "help": "no-sync-last: skip the sync on the last micro-batch too; none,no-sync-last: both"})
    loop_file: str | None = field(default=None, metadata={"help": "a .py file defining "
        "accumulate(model, micro_batches, loss_fn): used instead of ours"})
    tolerance: float = field(default=1e-5,
                             metadata={"help": "equal: max|g - g_ref| <= this * max|g_ref|"})
    steps: int = field(default=10, metadata={"help": "optimizer steps"})
    batch_size: int = field(default=8, metadata={"help": "sequences per rank per micro-batch"})
    last_batch_size: Sizes = field(default=Sizes("0"), metadata={"help": "sequences per rank in "
        "the last micro-batch of a step (0: --batch-size): " + Sizes.expected})
    variants: tuple | None = field(default=None, metadata={
        "parse": parse_variants, "metavar": "'FLAG=V,FLAG=V;...'", "help": VARIANTS_HELP})


def accumulate(model, micro_batches, loss_fn, no_sync=True, bug="none"):
    """Backward over K micro-batches so that the gradient is the one of their mean loss."""
    last = len(micro_batches) - 1
    total = 0.0
    for i, (x, y) in enumerate(micro_batches):
        sync = i == last or not no_sync   # only the last micro-batch must reduce-scatter
        if bug == "no-sync-last":
            sync = not no_sync            # the pitfall: the last one skips it as well
        if isinstance(model, FSDP):       # classic FSDP: a context manager around fwd + bwd
            context = nullcontext() if sync else model.no_sync()
        else:                             # FSDP2: a switch, set before the backward
            model.set_requires_gradient_sync(sync)
            context = nullcontext()
        with context:
            # Divide by K: the K backward passes *add* their gradients, and the big batch's
            # loss is the mean over all micro-batches, not their sum.
            loss = loss_fn(model(x), y) / len(micro_batches)
            loss.backward()
        total += loss.detach()
    return total


def train(cfg: Config, api: str, sizes: tuple, no_sync: bool, bug: str, env, data, loop,
          references) -> dict:
    # --- model: the same initial weights on every rank (and in the reference) ---------------
    torch.manual_seed(cfg.seed)
    model = GPT(cfg.model_config(data.vocab_size)).to(env.device)
    accum = len(sizes)  # K micro-batches of these sizes (sequences per rank)
    if sizes not in references:  # every run starts from the same weights: once per sizes
        references[sizes] = accumulation.big_batch_reference(model, [  # every rank's step-0 rows
            data.batch(i, 0, 1, n * env.world_size, cfg.seq_len, env.device) for i,
            n in enumerate(sizes)])
    num_params = sum(p.numel() for p in model.parameters())
    padded = (theory.accumulation.fsdp1_padded_numel(theory.fsdp_unit_numels(model, Block),
                                                     env.world_size)
              if api == "fsdp1" else theory.accumulation.fsdp2_padded_numel(model, env.world_size))

    # --- shard: FULL_SHARD, one unit per transformer block, in either API -------------------
    if api == "fsdp1":
        model = FSDP(model, auto_wrap_policy=functools.partial(
                         transformer_auto_wrap_policy, transformer_layer_cls={Block}),
                     device_id=env.device)  # required on CPU too, else FSDP looks for a GPU
    else:
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)

    # --- optimizer: after sharding, so it holds the shards -----------------------------------
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)

    # loss_fn runs between one micro-batch's backward and the next: count the gradients carried.
    held_between = {"sharded": 0, "unsharded": 0}
    counting_loss = accumulation.counting(lm_loss, model, held_between)

    # --- loop -------------------------------------------------------------------------------
    print_header(env, api, sizes, no_sync, bug, cfg.loop_file)
    logger = MetricLogger(env, cfg.log_every)
    step_error = None
    for step in range(cfg.steps):
        micro_batches = [data.batch(step * accum + i, env.rank, env.world_size, n, cfg.seq_len,
                                    env.device) for i, n in enumerate(sizes)]
        watch = step == 0  # the instruments slow a step: they watch step 0, left out of ms/step
        start = time.perf_counter()
        with CommCounter() if watch else nullcontext() as comm:
            loss = loop(model, micro_batches, counting_loss if watch else lm_loss)
        ms = (time.perf_counter() - start) * 1e3
        if watch:  # the gradient against the one-process, one-big-batch reference
            grads, collectives = accumulation.held_grad_bytes(model), comm.summary()
            check = accumulation.compare_with_reference(model, references[sizes], env.rank,
                                                        env.world_size)
            check["equal"] = check["rel_err"] is not None and check["rel_err"] <= cfg.tolerance
            before = [p.detach().clone() for p in model.parameters()]
        start = time.perf_counter()
        try:
            optimizer.step()
        except RuntimeError as exc:
            if bug == "none":
                raise
            # Classic FSDP + the bug: the gradient never got reduce-scattered, so it is the
            # unsharded size while the parameter (and Adam's state) is this rank's shard.
            step_error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        if watch:
            check["step_changed_params"] = any(
                not torch.equal(b, p.detach()) for b, p in zip(before, model.parameters()))
            state = state_bytes(model, optimizer)
            peak = state["params"] + state["optimizer"] + max(sum(held_between.values()),
                                                              sum(grads.values()))
        optimizer.zero_grad(set_to_none=True)
        ms += (time.perf_counter() - start) * 1e3
        loss = torch.as_tensor(loss or 0.0, device=env.device).float()  # a learner may return None
        logger.log(step, mean_over_ranks(loss), ms, peak / MiB if watch else None,
                   comm.total_bytes / MiB if watch else None,
                   last=watch or step == cfg.steps - 1 or step_error is not None)
        if step_error:
            break

    # --- report: every rank's gradient check and memory; bytes against theory ----------------
    return report_run(env, {"api": api, "accum": accum, "no_sync": no_sync, "bug": bug,
                            "num_params": num_params, "padded_numel": padded,
                            "micro_batch_sizes": sizes, "step_error": step_error},
                      check, held_between, grads, collectives, logger.history, cfg.tolerance)


def main() -> None:
    cfg = parse_config(Config, __doc__)
    with distributed(seed=cfg.seed) as env:
        # --- setup ---------------------------------------------------------------------------
        plan = planned_runs(cfg)  # every run's flags, checked first: a bad one is one line, exit 2
        learner = load_learner(cfg.loop_file, "--loop-file", "accumulate(model, micro_batches, "
                               "loss_fn)").accumulate if cfg.loop_file else None
        env.print0(f"lesson 3 | {env.world_size} ranks | {env.backend} on {env.device.type} | "
                   f"{describe(cfg)}")
        data = load_data(cfg.data, seed=cfg.seed)
        # FSDP2 warns that the model returns a view; lm_loss never modifies it in place.
        warnings.filterwarnings("ignore", message=".*returned a view tensor.*")

        runs, references = [], {}
        for run_cfg, api, sizes, no_sync, bug in plan:  # the command line's runs, then variants'
            loop = learner or functools.partial(accumulate, no_sync=no_sync, bug=bug)
            runs.append(train(run_cfg, api, sizes, no_sync, bug, env, data, loop, references))

        print_summary(env, runs)
        write_metrics(cfg.metrics, "lesson3", env, cfg, runs[-1]["history"], {"runs": runs})


if __name__ == "__main__":
    main()
