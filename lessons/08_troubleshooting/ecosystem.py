"""The same FSDP under other names: Hugging Face accelerate's FSDP config, DeepSpeed ZeRO stages.

- ``accelerate_env(config)``: the environment ``accelerate launch --config_file CONFIG`` gives
  each process (accelerate's own launcher code builds it), and ``accelerate_plugin(config)``
  the ``FullyShardedDataParallelPlugin`` accelerate builds from that environment.
- ``accelerate_mixed_precision(fsdp_version, precision)``: the policy accelerate builds from its
  top-level ``mixed_precision`` (its own ``set_mixed_precision``, as its ``AcceleratorState``
  calls it).
- ``fully_shard_kwargs(plugin, block_cls)``: what that plugin means in the course's own calls.
- ``zero_table(shape, world_size, batch)``: per-rank bytes of ZeRO stages 0-3 next to FSDP's
  strategies, from lesson 7's planner (``fsdp_course.theory.memory``).
- ``ZERO_EXTRAS`` and ``fsdp_hooks_for_zero_extras()``: DeepSpeed's other features, what FSDP has
  for each, and the FSDP2 names that says exist, looked up in the installed torch.
"""

from __future__ import annotations

import os
from contextlib import contextmanager

# accelerate config key (fsdp_config: ...) -> the FSDP argument or call, and the lesson that
# showed it. Checked against accelerate's FullyShardedDataParallelPlugin and its launcher.
ACCELERATE_KEYS = [
    ("fsdp_version: 2 | 1", "fully_shard(...) | FullyShardedDataParallel(...)", "5 | 1"),
    ("fsdp_reshard_after_forward: true | false (v2)",
     "reshard_after_forward=True (ZeRO-3) | False (ZeRO-2)", "5"),
    ("fsdp_sharding_strategy: FULL_SHARD | SHARD_GRAD_OP | NO_SHARD | HYBRID_SHARD (v1)",
     "sharding_strategy=ShardingStrategy.<same>", "1"),
    ("fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP + fsdp_transformer_layer_cls_to_wrap: Block",
     "fully_shard(block) per Block, then the root | transformer_auto_wrap_policy({Block})", "2, 5"),
    ("fsdp_auto_wrap_policy: SIZE_BASED_WRAP + fsdp_min_num_params: N",
     "size_based_auto_wrap_policy(min_num_params=N)", "2"),
    ("fsdp_state_dict_type: SHARDED_STATE_DICT | FULL_STATE_DICT",
     "get_state_dict(..., StateDictOptions(full_state_dict=False | True)) + DCP", "4"),
    ("fsdp_offload_params: true",
     "offload_policy=CPUOffloadPolicy() | cpu_offload=CPUOffload(offload_params=True)", "5, 7"),
    ("mixed_precision: bf16 (top level)",
     "mp_policy=MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16, output_dtype=bf16) | "
     "MixedPrecision(param_dtype=bf16, reduce_dtype=bf16, buffer_dtype=bf16): a bf16 reduction and "
     "(v1) bf16 buffers", "5, 6"),
    ("fsdp_activation_checkpointing: true",
     "apply_activation_checkpointing / checkpoint_wrapper on each Block (before fully_shard)", "7"),
    ("fsdp_cpu_ram_efficient_loading + fsdp_sync_module_states: true",
     "meta-device build; rank 0 loads, set_model_state_dict(broadcast_from_rank0=True)", "5"),
    ("fsdp_forward_prefetch / fsdp_backward_prefetch",
     "forward_prefetch / backward_prefetch | set_modules_to_forward_prefetch", "1, 5"),
]


def accelerate_env(config: str) -> dict[str, str]:
    """The FSDP_* / ACCELERATE_* variables ``accelerate launch --config_file config`` sets for
    its processes (accelerate's launcher code: ``prepare_multi_gpu_env``)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    args = launch_command_parser().parse_args(["--config_file", str(config), "script.py"])
    args, _, _ = _validate_launch_command(args)
    env = prepare_multi_gpu_env(args)
    return {k: v for k, v in env.items() if k.startswith(("FSDP_", "ACCELERATE_USE_FSDP",
                                                          "ACCELERATE_MIXED"))}


@contextmanager
def _environ(values: dict[str, str]):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def accelerate_plugin(config: str):
    """accelerate's ``FullyShardedDataParallelPlugin``, built from the config as its launched
    processes build it (from the environment above)."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    env = accelerate_env(config)
    with _environ(env):
        plugin = FullyShardedDataParallelPlugin()
    precision = env.get("ACCELERATE_MIXED_PRECISION", "no")
    if precision != "no":  # accelerate's AcceleratorState does this from the same variable
        plugin.set_mixed_precision(precision)
    return plugin


def accelerate_mixed_precision(fsdp_version: int, precision: str = "bf16"):
    """The mixed-precision policy accelerate gives FSDP for its top-level ``mixed_precision``
    (``FullyShardedDataParallelPlugin.set_mixed_precision``, which ``AcceleratorState`` calls with
    that setting alone): a ``MixedPrecisionPolicy`` for ``fsdp_version`` 2, a ``MixedPrecision``
    for 1."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(fsdp_version=fsdp_version)
    plugin.set_mixed_precision(precision)
    return plugin.mixed_precision_policy


def fully_shard_kwargs(plugin) -> dict:
    """The plugin's settings as the course writes them with ``fully_shard`` (FSDP2)."""
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    if plugin.fsdp_version != 2:
        raise ValueError("this mapping is for fsdp_version: 2 (fully_shard)")
    kwargs = {"reshard_after_forward": bool(plugin.reshard_after_forward)}
    if type(plugin.cpu_offload).__name__ == "CPUOffloadPolicy":  # OffloadPolicy() means none
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    if plugin.mixed_precision_policy is not None:
        policy = plugin.mixed_precision_policy
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=policy.param_dtype,
                                                   reduce_dtype=policy.reduce_dtype,
                                                   output_dtype=policy.output_dtype)
    return kwargs


def wrap_targets(plugin) -> list[str]:
    """The module classes accelerate would shard one by one (TRANSFORMER_BASED_WRAP)."""
    return list(plugin.transformer_cls_names_to_wrap or [])


# ZeRO stage -> the FSDP setting that matches it (lesson 7's planner strategy), None: no FSDP one
ZERO_TO_FSDP = {0: ("DDP (FSDP NO_SHARD)", "DDP"),
                1: ("no FSDP strategy: torch's ZeroRedundancyOptimizer with DDP", None),
                2: ("closest: SHARD_GRAD_OP / reshard_after_forward=False", "SHARD_GRAD_OP"),
                3: ("FULL_SHARD / fully_shard(reshard_after_forward=True)", "FULL_SHARD")}


def zero_table(shape, world_size: int, batch: int) -> list[dict]:
    """Per-rank bytes, DeepSpeed ZeRO stage by stage (the ZeRO paper's mixed-precision Adam
    accounting, ``theory.memory.zero_stage_bytes``: 2 + 2 + 12 bytes per parameter, sharded as
    the stage says), next to the FSDP setting that matches it, as lesson 7's planner
    (``theory.memory.plan``, bf16 mixed precision, AdamW) counts it: the sharded state and the
    step's peak with ``batch`` sequences per rank.

    FSDP keeps fp32 master weights and gradients (4 + 4 + 8 = the same 16 bytes per parameter,
    split differently); its SHARD_GRAD_OP shards the parameters at rest too (ZeRO-2 does not)
    and pays for it with the gathered parameters held between forward and backward.
    """
    from fsdp_course.theory import memory

    rows = []
    for stage, (fsdp, strategy) in ZERO_TO_FSDP.items():
        zero = memory.zero_stage_bytes(shape.num_params, world_size, stage)
        row = {"DeepSpeed": f"ZeRO-{stage}", "ZeRO state/rank": int(zero["total"]), "FSDP": fsdp,
               "FSDP state/rank": "", "FSDP peak/rank": ""}
        if strategy:
            plan = memory.plan(shape, batch, world_size, strategy, precision="bf16-mixed")
            state = plan["categories"]
            row["FSDP state/rank"] = state["params"] + state["grads"] + state["optimizer"]
            row["FSDP peak/rank"] = plan["peak"]
        rows.append(row)
    return rows


# DeepSpeed's features beyond the four stages -> what FSDP has for each.
ZERO_EXTRAS = [
    ("ZeRO-1 (shard only the optimizer state)",
     "no FSDP strategy; torch.distributed.optim.ZeroRedundancyOptimizer does it with DDP"),
    ("ZeRO++ hpZ (after forward, a second copy of the parameters sharded within each node, so "
     "backward's all-gather stays inside the node)",
     "fully_shard(reshard_after_forward=<int>): after forward, reshard to groups of that many "
     "ranks "
     "(the GPUs of a node), and backward all-gathers within them (lesson 5 measures 2 on 4 ranks). "
     "Not HSDP: HSDP also replicates the gradients and the optimizer state across nodes"),
    ("ZeRO++ qwZ / qgZ (quantized weights / gradients on the wire)",
     "no built-in quantized collective; the extension points are there: a tensor subclass with "
     "fsdp_pre_all_gather / fsdp_post_all_gather (what torchao's float8 all-gather uses), and "
     "FSDPModule.set_custom_all_gather / set_custom_reduce_scatter"),
    ("ZeRO-Infinity (offload to NVMe)",
     "none; FSDP offloads to CPU memory only (CPUOffloadPolicy)"),
]


def fsdp_hooks_for_zero_extras() -> dict:
    """The FSDP2 names ``ZERO_EXTRAS`` relies on, looked up in the installed torch: the
    ``reshard_after_forward`` int (``fully_shard``'s docstring), the tensor-subclass hooks FSDP2
    calls (its ``_fsdp_param`` source), the custom-collective setters, and the collectives FSDP2
    ships (none quantized)."""
    import inspect

    from torch.distributed.fsdp import FSDPModule, fully_shard
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives, _fsdp_param
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

    doc = [line.strip() for line in (inspect.getdoc(fully_shard) or "").splitlines()]
    start = next(i for i, line in enumerate(doc) if line.startswith("- If an ``int``"))
    end = next(i for i in range(start + 1, len(doc)) if doc[i].startswith("- ") or not doc[i])
    param_source = inspect.getsource(_fsdp_param)
    return {
        "reshard_after_forward int": " ".join(doc[start:end]),
        "tensor-subclass hooks FSDP2 calls": [
            name for name in ("fsdp_pre_all_gather", "fsdp_post_all_gather")
            if f'hasattr(inner_tensor, "{name}")' in param_source],
        "FSDPModule setters": [name for name in ("set_custom_all_gather",
                                                 "set_custom_reduce_scatter")
                               if callable(getattr(FSDPModule, name, None))],
        "built-in collectives": sorted(c.__name__ for base in (AllGather, ReduceScatter)
                                       for c in base.__subclasses__()
                                       if c.__module__ == _fsdp_collectives.__name__),
    }
