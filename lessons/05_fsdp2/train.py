"""Lesson 5: FSDP2 (``fully_shard``): DTensor parameters, its options, and moving lesson 1 to it.

Builds the course GPT on the meta device, calls ``fully_shard`` on every block and then on the
root, allocates and initialises the shards, and trains. One step per variant is measured (the
instruments slow it down; the other steps are only timed): memory by category (FSDPMemTracker),
bytes per collective and group, the DTensor layout, and the checks that catch the pitfalls.

    bash launch/lesson5.sh                           # fully_shard on 2 ranks, FSDP2's defaults
    bash launch/lesson5.sh --reshard-after-forward true --mixed-precision --prefetch 2
    NPROC=4 bash launch/lesson5.sh --reshard-after-forward 2   # reshard to groups of 2 ranks
    bash launch/lesson5.sh --variants "api=classic;reshard-after-forward=false"
    bash launch/lesson5.sh --bug meta-buffers        # or: --bug optimizer-first
    bash launch/lesson5.sh --compile blocks --fullgraph --compile-backend aot_eager
    bash launch/lesson5.sh --shard-module solutions/lesson5_shard.py   # your shard(model, mesh)
"""

import time
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

import runs  # this lesson's runs: variants, checks, tables
from fsdp_course.config import TrainConfig, describe, flag, parse_config, parse_variants
from fsdp_course.data import load_data
from fsdp_course.dist import distributed, mean_over_ranks
from fsdp_course.learner import load_learner
from fsdp_course.measure import MiB
from fsdp_course.measure_fsdp2 import GroupCommCounter, MemoryProbe, resharding
from fsdp_course.model import GPT, lm_loss
from fsdp_course.report import MetricLogger


@dataclass
class Config(TrainConfig):
    api: str = flag("fsdp2", "fsdp2: fully_shard; classic: lesson 1's FullyShardedDataParallel",
                    runs.APIS)
    reshard_after_forward: bool | int | None = flag(  # parsed once, as fully_shard takes it
        None, "default (blocks true, root false), true (the root too), false, or a group size",
        parse=runs.parse_reshard, metavar="{default,true,false,N}")
    mixed_precision: bool = flag(False,
                                 "bf16 parameters in forward/backward, fp32 gradient reduction")
    prefetch: int = flag(0, "explicit prefetching: each block all-gathers the next N (0: implicit)")
    grad_accum: int = flag(1, "micro-batches per step; gradients sync on the last one only")
    cpu_offload: bool = flag(False, "CPUOffloadPolicy: shards and optimizer on CPU")
    replicas: int = flag(1, "HSDP: a 2-D mesh (replicas x ranks/replicas): shard in a row, "
                            "replicate across")
    compile: str = flag("none", "blocks: block.compile() each block, then shard; model-before / "
                        "model-after: torch.compile(model) before / after fully_shard",
                        runs.COMPILES)
    fullgraph: bool = flag(False,
                           "torch.compile(fullgraph=True): one graph, no graph breaks allowed")
    compile_backend: str = flag("inductor",
                                "torch.compile backend (inductor: C++ on CPU, slow to compile)")
    bug: str | None = flag(None, "reproduce a pitfall", runs.BUGS)
    shard_module: str | None = flag(
        None, "a .py file defining shard(model, mesh), called instead of fully_shard")
    variants: tuple | None = flag(
        None, "several runs in one launch: 'api=classic;prefetch=2,mixed-precision=true'",
        parse=parse_variants, metavar="'FLAG=V,FLAG=V;...'")


def build_fsdp2(cfg, env, mesh, model_cfg, shard_fn=None):
    """Meta-device build -> (compile) -> fully_shard (blocks, then the root) -> to_empty -> init."""
    # --- model: on the meta device: shapes only, no memory, no values yet ----------------------
    with torch.device("meta"):
        model = GPT(model_cfg)
    early_optimizer = None
    if cfg.bug == "optimizer-first":  # BUG: holds the parameters fully_shard is about to replace
        early_optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    compile_options = dict(backend=cfg.compile_backend, fullgraph=cfg.fullgraph)
    runs.forget_compiled(cfg)  # compile from scratch: a cached graph would hide the compile time
    if cfg.compile == "blocks":  # in place: same Block class, same parameter names
        for block in model.blocks:
            block.compile(**compile_options)
    elif cfg.compile == "model-before":  # a wrapper (OptimizedModule): names get "_orig_mod."
        model = torch.compile(model, **compile_options)

    if cfg.replicas > 1:  # HSDP (classic HYBRID_SHARD): placements become (Replicate(), Shard(0))
        mesh = init_device_mesh(env.device.type, (cfg.replicas, env.world_size // cfg.replicas),
                                mesh_dim_names=("replicate", "shard"))

    # --- shard: every Block its own unit (gathered one at a time), then the root (the rest) ----
    # reshard_after_forward=None lets FSDP2 choose: True for the blocks, False for the root.
    options = dict(mesh=mesh, reshard_after_forward=cfg.reshard_after_forward)
    if cfg.mixed_precision:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                    reduce_dtype=torch.float32)
    if cfg.cpu_offload:  # pinned memory needs an accelerator; on CPU ranks it must be off
        options["offload_policy"] = CPUOffloadPolicy(pin_memory=env.device.type == "cuda")
    if shard_fn is not None:
        shard_fn(model, mesh)  # the exercise: your own fully_shard calls
    else:
        for block in model.blocks:
            fully_shard(block, **options)
        fully_shard(model, **options)
    if cfg.prefetch:  # block i all-gathers blocks i+1..i+N in forward, i-1..i-N in backward
        blocks = list(model.blocks)
        for i, block in enumerate(blocks):
            block.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + cfg.prefetch])
            block.set_modules_to_backward_prefetch(blocks[max(0, i - cfg.prefetch):i][::-1])
    if cfg.compile == "model-after":  # torchtitan's alternative: the whole model, once sharded
        model = torch.compile(model, **compile_options)

    # --- init: allocate this rank's shards, then fill weights AND buffers ----------------------
    model.to_empty(device="cpu" if cfg.cpu_offload else env.device)
    if cfg.bug != "meta-buffers":
        model.init_weights()  # skipped (BUG): the causal masks keep whatever to_empty left there
    return model, early_optimizer


def train(cfg, env, data, mesh, reference, shard_fn=None) -> dict:
    """Build one variant, train it, return what was measured and what the checks found."""
    if cfg.api == "classic":
        model, early_optimizer, notices = runs.build_classic(cfg, env, reference), None, []
    else:
        with runs.fully_shard_notices() as notices:  # fully_shard's own warnings, said once
            model, early_optimizer = build_fsdp2(cfg, env, mesh, reference.cfg, shard_fn)
        # Load the reference's weights as from a checkpoint only rank 0 read (the others get
        # rank 0's tensors): every variant then trains the same model. Non-persistent buffers
        # (the causal mask) are not in a state dict: only init_weights() above filled them.
        set_model_state_dict(model, reference.state_dict() if env.is_rank0 else {},
                             options=StateDictOptions(full_state_dict=True,
                                                      broadcast_from_rank0=True))

    # --- optimizer: after sharding, so it holds the sharded (DTensor) parameters ---------------
    optimizer = early_optimizer or torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    before = dict(runs.checks_before_training(cfg, env, data, model, optimizer, reference),
                  notices=notices)

    # --- loop -----------------------------------------------------------------------------------
    env.print0(f"\n== {runs.variant_label(cfg)} ==", *notices, sep="\n")
    logger = MetricLogger(env, cfg.log_every)
    tracked = min(1, cfg.steps - 1)  # one step measured by the instruments (they slow it down)
    memory, collectives, kept = {}, {}, None
    for step in range(cfg.steps):
        measure = step == tracked and cfg.compile == "none"  # dispatch-mode trackers vs compile
        start = time.perf_counter()
        step_loss = torch.zeros((), device=env.device)
        with GroupCommCounter() if measure else nullcontext() as comm, \
                MemoryProbe(model, optimizer, enabled=measure) as probe, \
                runs.compile_failure(cfg) as failed:
            for micro in range(cfg.grad_accum):
                last = micro == cfg.grad_accum - 1
                if cfg.grad_accum > 1 and cfg.api == "fsdp2":
                    model.set_requires_gradient_sync(last)  # reduce-scatter on the last only
                x, y = data.batch(step * cfg.grad_accum + micro, env.rank, env.world_size,
                                  cfg.batch_size, cfg.seq_len, env.device)
                with model.no_sync() if cfg.api == "classic" and not last else nullcontext():
                    loss = lm_loss(model(x), y) / cfg.grad_accum
                    probe.after_forward()  # what reshard_after_forward kept until backward
                    loss.backward()
                step_loss += loss.detach()
            probe.before_zero_grad()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if failed:  # the compiler refused this model: the message is the lesson
            return runs.stopped_run(cfg, env, before, failed)
        ms = (time.perf_counter() - start) * 1e3
        if measure:
            memory, collectives = probe.peaks, dict(comm.summary(), by_group=comm.by_group())
            kept = resharding(model) if cfg.api == "fsdp2" else None
        peak, sent = (memory["peak"] / MiB, comm.total_bytes / MiB) if measure else (None, None)
        logger.log(step, mean_over_ranks(step_loss), ms, peak, sent,  # None: printed as "-"
                   last=measure or step == cfg.steps - 1)

    # --- report: what changed, what was measured, what the checks say --------------------------
    return runs.finished_run(cfg, env, model, before, logger.history, tracked, memory,
                             collectives, kept)


def main() -> None:
    cfg = parse_config(Config, __doc__)
    with distributed(seed=cfg.seed) as env:
        # --- setup ---------------------------------------------------------------------------
        runs.silence_known_warnings()
        variants = runs.checked_variants(cfg, env.world_size)  # a bad flag: one line, exit 2
        shard_fn = load_learner(cfg.shard_module, "--shard-module", "shard(model, mesh)").shard \
            if cfg.shard_module else None
        env.print0(f"lesson 5 | {env.world_size} ranks | {env.backend} on {env.device.type} | "
                   f"{describe(cfg)}")
        data = load_data(cfg.data, seed=cfg.seed)
        # A 1-D mesh over all ranks: parameters become DTensors with placements (Shard(0),).
        mesh = init_device_mesh(env.device.type, (env.world_size,), mesh_dim_names=("shard",))
        # The single-process reference: the same seed on every rank gives the same weights.
        torch.manual_seed(cfg.seed)
        reference = GPT(cfg.model_config(data.vocab_size)).to(env.device)

        results = [train(v, env, data, mesh, reference, shard_fn) for v in variants]

        # --- report ----------------------------------------------------------------------------
        runs.print_report(env, results)
        runs.save_metrics(cfg, env, results)  # the history: the last run that has one


if __name__ == "__main__":
    main()
