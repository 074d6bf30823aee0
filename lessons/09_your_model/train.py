"""Lesson 9: your model. A Hugging Face ``transformers`` model, end to end on FSDP2.

Builds a ``LlamaForCausalLM`` from a ``LlamaConfig`` (no download), finds its decoder block class
from the model itself, applies activation checkpointing per block, ``fully_shard``s every block
then the root with bf16 mixed precision, and trains it on the course's own text (bytes). Then:
DCP save and a bitwise resume; export to the Hugging Face format two ways (full state dict on
rank 0 -> ``save_pretrained``; ``HuggingFaceStorageWriter`` from every rank) and the way back in
(rank 0 reads the safetensors, ``broadcast_from_rank0``); and DeepSpeed ZeRO-1/2/3 beside FSDP2
and classic FSDP on the same model, data and initial weights, in fp32.

    bash launch/lesson9.sh                                  # all three parts on 2 ranks
    bash launch/lesson9.sh --parts train --steps 40         # train longer
    bash launch/lesson9.sh --parts compare --compare zero3,fsdp2 --compare-steps 5
    bash launch/lesson9.sh --family qwen2 --shard-module solutions/lesson9_shard.py --parts train
    # a GPU node (one rank per GPU, NCCL): an 8B model from its config.json (not run on CPU)
    bash launch/lesson9.sh --hf-config lessons/09_your_model/configs/llama3-8b.json \\
        --parts train,checkpoint --seq-len 2048 --batch-size 1
"""

import time
from dataclasses import dataclass

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    apply_activation_checkpointing,
)
from torch.distributed.checkpoint import HuggingFaceStorageWriter
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import hf_model as hf  # this lesson's model side: config, blocks, corpus, checks
import zero  # this lesson's DeepSpeed comparison
from fsdp_course.checkpoint import compare_fingerprints, fingerprint
from fsdp_course.config import TrainConfig, describe, flag, int_at_least, list_help, parse_config
from fsdp_course.dist import distributed, mean_over_ranks
from fsdp_course.learner import load_learner
from fsdp_course.measure import MiB
from fsdp_course.measure_fsdp2 import MemoryProbe
from fsdp_course.report import MetricLogger, write_metrics
from runs import PARTS, Parts, Variants, describe_model, print_report


@dataclass
class Config(TrainConfig):
    steps: int = flag(12, "optimizer steps")
    data: str | None = flag(None, "train on this file's bytes instead of "
                            "lessons/09_your_model/corpus.txt")
    batch_size: int = flag(4, "sequences per rank per step")
    log_every: int = flag(3, "print a metric line every N steps")
    family: str = flag("llama", "the transformers model family built from config",
                       choices=hf.FAMILIES)
    ffn: int = flag(352, "MLP width (intermediate_size)")
    kv_heads: int = flag(2, "key/value heads (grouped-query attention)")
    parts: Parts = flag(Parts(PARTS), list_help("parts", PARTS) + " (compare builds the model on "
                        "every rank: small models only)")
    mixed_precision: bool = flag(True, "MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)")
    activation_checkpointing: bool = flag(True, "recompute each block in backward")
    compare: Variants = flag(Variants(zero.VARIANTS), list_help("variants", zero.VARIANTS))
    compare_steps: int = flag(3, "steps per variant in the comparison (fp32)",
                              parse=int_at_least(1))
    hf_config: str | None = flag(None, "build the model from this config.json (or its folder) "
                                 "instead")
    out: str = flag("runs/lesson9", "where checkpoints and exported models go")
    shard_module: str | None = flag(None, "a .py file defining shard(model, mesh), called "
                                    "instead of fully_shard")


def shard(cfg, env, mesh, config, reference, shard_fn=None):
    """Meta build -> activation checkpointing -> fully_shard (blocks, then root) -> weights."""
    model = hf.build(config, "meta")  # shapes only: a 70B model costs nothing here
    block_cls = hf.block_classes(model)  # from model._no_split_modules, e.g. LlamaDecoderLayer
    # Activation checkpointing first: fully_shard then sees the wrapped blocks (FSDP2's order).
    if cfg.activation_checkpointing:
        apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, tuple(block_cls)))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if cfg.mixed_precision else MixedPrecisionPolicy()
    if shard_fn is not None:
        shard_fn(model, mesh)  # the exercise: your fully_shard calls
    else:
        for block in hf.blocks(model):
            fully_shard(block, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
    model.to_empty(device=env.device)  # this rank's shards, uninitialised
    garbage = hf.refill_buffers(model, reference)  # rotary inv_freq: in no state dict
    # Only rank 0 holds the whole model (a 70B one needs a big host, not 8 copies of it): the
    # others receive their shards of rank 0's tensors.
    set_model_state_dict(model, reference.state_dict() if env.is_rank0 else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    return model, garbage


def train(cfg, env, data, model, optimizer) -> dict:
    logger, memory = MetricLogger(env, cfg.log_every), {}
    for step in range(cfg.steps):
        watch = step == min(1, cfg.steps - 1)  # one step measured (the tracker slows it)
        start = time.perf_counter()
        with MemoryProbe(model, optimizer, enabled=watch) as probe:
            x, y = data.batch(step, env.rank, env.world_size, cfg.batch_size, cfg.seq_len,
                              env.device)
            loss = hf.lm_loss(model(x).logits, y)
            loss.backward()
            probe.before_zero_grad()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        memory = probe.peaks if watch else memory
        ms = (time.perf_counter() - start) * 1e3
        logger.log(step, mean_over_ranks(loss), ms, memory["peak"] / MiB if watch else None, None,
                   last=watch or step == cfg.steps - 1)
    return {"history": logger.history, "memory": memory}


def checkpoints(cfg, env, mesh, config, model, optimizer, data) -> dict:
    out = hf.fresh_folder(cfg.out, env)  # what an earlier run left there is removed first
    # --- DCP: every rank writes its own shards (and the optimizer's), in parallel ------------
    dcp.save(dict(zip(("model", "optim"), get_state_dict(model, optimizer))),
             checkpoint_id=out / "dcp")
    # --- export 1: gather the full state dict to rank 0, then transformers' save_pretrained -----
    full = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if env.is_rank0:  # full is {} on the other ranks (cpu_offload gathers to rank 0 only)
        plain = hf.build(config)
        plain.load_state_dict(full)
        plain.save_pretrained(out / "hf_full")
    # --- export 2: every rank writes its shards as safetensors; consolidated into whole tensors --
    dcp.save(get_model_state_dict(model), storage_writer=HuggingFaceStorageWriter(
        str(out / "hf_dcp"), save_distributed=True, enable_consolidation=True))
    if env.is_rank0:
        config.save_pretrained(out / "hf_dcp")  # from_pretrained needs the config.json beside them
    probe = hf.probe_ids(data, cfg.seq_len).to(env.device)
    with torch.no_grad():
        logits = model(probe).logits.float()  # collective: every rank runs it
    if env.is_rank0:
        torch.save(logits, out / "logits.pt")  # what from_pretrained must reproduce
    # --- resume: a model started from another seed loads the DCP checkpoint -------------------
    other, _ = shard(cfg, env, mesh, config, hf.build_on_rank0(config, env, seed=cfg.seed + 1))
    other_opt = torch.optim.AdamW(other.parameters(), lr=cfg.lr)
    state = dict(zip(("model", "optim"), get_state_dict(other, other_opt)))
    differs_before = not compare_fingerprints(fingerprint(model), fingerprint(other))["equal"]
    dcp.load(state, checkpoint_id=out / "dcp")
    set_state_dict(other, other_opt, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    loaded = compare_fingerprints(fingerprint(model, optimizer), fingerprint(other, other_opt))
    next_losses = [hf.one_step(m, o, data, cfg, env, cfg.steps)
                   for m, o in ((model, optimizer), (other, other_opt))]
    # --- the way in: rank 0 reads a Hugging Face checkpoint, every rank gets its shards --------
    fresh, _ = shard(cfg, env, mesh, config, hf.build_on_rank0(config, env, seed=cfg.seed + 2))
    set_model_state_dict(fresh, hf.read_safetensors(out / "hf_full") if env.is_rank0 else {},
                         options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    way_in = hf.compare_with_from_pretrained(fresh, out / "hf_full", probe, env,
                                             hf.compute_dtype(cfg))
    return {"dcp_files": hf.files(out / "dcp"), "hf_full_files": hf.files(out / "hf_full"),
            "hf_dcp_files": hf.files(out / "hf_dcp"), "differs_before_load": differs_before,
            "loaded": loaded, "next_losses": next_losses, "way_in": way_in, "out": str(out)}


def main() -> None:
    cfg = parse_config(Config, __doc__)
    with distributed(seed=cfg.seed) as env:
        # --- setup --------------------------------------------------------------------------
        hf.quiet(env.device)
        data = hf.load_corpus(cfg.data, cfg.seed)
        # What a config.json holds: read one (--hf-config), or the family's config with our sizes.
        config = (hf.read_config(cfg.hf_config) if cfg.hf_config
                  else hf.config_for(cfg.family, cfg, data.vocab_size))
        reference = hf.build_on_rank0(config, env, seed=cfg.seed)  # the plain model; None elsewhere
        shard_fn = (load_learner(cfg.shard_module, "--shard-module", "shard(model, mesh)").shard
                    if cfg.shard_module else None)
        env.print0(f"lesson 9 | {env.world_size} ranks | {env.backend} on {env.device.type} | "
                   f"{describe(cfg)}")
        mesh = init_device_mesh(env.device.type, (env.world_size,), mesh_dim_names=("shard",))
        results = describe_model(env, reference)

        # --- model, shard, optimizer, loop: bf16 compute, fp32 master weights and reduction ----
        if {"train", "checkpoint"} & set(cfg.parts):
            model, garbage = shard(cfg, env, mesh, config, reference, shard_fn)
            optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)  # after sharding: DTensors
            results["train"] = dict(train(cfg, env, data, model, optimizer),
                                    garbage_buffers=garbage, **hf.sharding_report(model))
        # --- checkpoints that leave the course ---------------------------------------------
        if "checkpoint" in cfg.parts:
            results["checkpoint"] = checkpoints(cfg, env, mesh, config, model, optimizer, data)
        # --- DeepSpeed ZeRO beside FSDP, fp32 ---------------------------------------------
        if "compare" in cfg.parts:
            results["compare"] = zero.compare(cfg, env, mesh, hf.build(config, seed=cfg.seed), data)
        # --- report ------------------------------------------------------------------------
        print_report(env, results)
        history = results.get("train", {}).get("history", [])
        write_metrics(cfg.metrics, "lesson9", env, cfg, history, results)


if __name__ == "__main__":
    main()
