"""Lesson 9's model side: a Hugging Face ``transformers`` model built from its config (no
download), its decoder blocks found from the model itself, the shipped text as bytes, what
``fully_shard`` made of it, and the checks that compare a sharded model with a plain one.

``transformers`` is imported inside the functions that use it (the course's optional extras are
imported where used).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from fsdp_course.data import TextData
from fsdp_course.dist import CourseError

CORPUS = Path(__file__).with_name("corpus.txt")
FAMILIES = ("llama", "qwen2", "mistral")
WRAPPED = "_checkpoint_wrapped_module."  # what activation checkpointing adds to names


def config_for(family: str, cfg, vocab_size: int):
    """The family's ``PretrainedConfig`` with the script's sizes: what a ``config.json`` holds."""
    import transformers

    sizes = dict(vocab_size=vocab_size, hidden_size=cfg.d_model, intermediate_size=cfg.ffn,
                 num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                 num_key_value_heads=cfg.kv_heads, max_position_embeddings=cfg.seq_len,
                 tie_word_embeddings=False)
    kind = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
            "mistral": transformers.MistralConfig}[family]
    return kind(**sizes)


def build(config, device: str | torch.device = "cpu", seed: int | None = None):
    """``AutoModelForCausalLM.from_config``: the architecture and a fresh initialisation, no
    weights downloaded. ``device="meta"``: shapes only (nothing allocated, nothing initialised)."""
    from transformers import AutoModelForCausalLM

    if seed is not None:
        torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config)


def build_on_rank0(config, env, seed: int):
    """The plain model on rank 0 only, on CPU (the host holds it once; ranks get shards)."""
    return build(config, "cpu", seed=seed) if env.is_rank0 else None


def read_config(path: str):
    """The config a ``config.json`` (or the folder holding it) describes: sizes, no weights."""
    file = Path(path)
    folder = file.parent if file.is_file() else file
    if not (folder / "config.json").is_file() and not file.is_file():
        raise CourseError(f"--hf-config {path}: no config.json there")
    import json

    from transformers import CONFIG_MAPPING

    try:  # a file of any name, as the planner takes it; AutoConfig wants config.json in a folder
        data = json.loads((file if file.is_file() else folder / "config.json").read_text())
        kind = CONFIG_MAPPING[data.pop("model_type")]
    except (ValueError, KeyError) as exc:
        raise CourseError(f"--hf-config {path}: not a transformers config.json "
                          f"({type(exc).__name__}: {exc})") from None
    return kind(**data)


def block_classes(model) -> set[type]:
    """The decoder block classes, read from the model: ``_no_split_modules`` names the modules a
    device map must keep whole (accelerate's FSDP auto wrap reads the same attribute)."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    # By the class's own name or a base's: fully_shard turns LlamaDecoderLayer's class into a
    # subclass named FSDPLlamaDecoderLayer.
    classes = {c for m in model.modules() for c in type(m).__mro__ if c.__name__ in names}
    if not classes:
        raise CourseError(f"{type(model).__name__} names no block class in _no_split_modules "
                          f"({sorted(names) or 'empty'}): pass the block class yourself")
    return classes


def blocks(model) -> list[torch.nn.Module]:
    classes = tuple(block_classes(model))
    return [m for m in model.modules() if isinstance(m, classes)]


def refill_buffers(model, reference) -> int:
    """Copy every buffer (rotary ``inv_freq``) from rank 0's plain model, broadcast to all
    ranks. A meta build leaves non-persistent buffers as whatever ``to_empty`` allocated, and no
    state dict holds them. Returns how many of them differed (on rank 0)."""
    import torch.distributed as dist

    theirs = dict(reference.named_buffers()) if reference is not None else {}
    wrong = 0
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if reference is not None:
                source = theirs[name.replace(WRAPPED, "")]
                wrong += not torch.equal(buffer, source)
                buffer.copy_(source)
            dist.broadcast(buffer, src=0)  # buffers are not sharded: every rank holds them whole
    return wrong


def load_corpus(path: str | None, seed: int) -> TextData:
    """The shipped text (or ``--data FILE``) as bytes: vocabulary 256, no tokenizer to train or
    ship; batches as every lesson takes them (a function of seed and step)."""
    file = Path(path) if path else CORPUS
    if not file.is_file():
        raise CourseError(f"--data {path}: no such file")
    raw = file.read_bytes()
    if len(raw) < 4096:
        raise CourseError(f"--data {path}: {len(raw)} bytes; need at least 4096")
    return TextData(tokens=torch.tensor(list(raw), dtype=torch.long),
                    vocab="".join(map(chr, range(256))), seed=seed)


def probe_ids(data: TextData, seq_len: int) -> torch.Tensor:
    """The fixed input every logits comparison uses: the corpus's first ``seq_len`` bytes."""
    return data.tokens[:seq_len].unsqueeze(0)


def compute_dtype(cfg) -> torch.dtype:
    """What forward computes in: bf16 under the mixed-precision policy, else fp32."""
    return torch.bfloat16 if cfg.mixed_precision else torch.float32


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def fsdp_units(model) -> list[str]:
    """The modules ``fully_shard`` was applied to, by name ("" is the root)."""
    from torch.distributed.fsdp import FSDPModule

    return [name for name, m in model.named_modules() if isinstance(m, FSDPModule)]


def quiet(device: torch.device) -> None:
    """transformers' and DeepSpeed's start-up chatter: said once here, not by every rank."""
    import logging
    import os

    if device.type == "cpu":  # DeepSpeed would guess the CPU and warn, on every rank
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import warnings

    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", message=".*torch.distributed.*")


def sharding_report(model) -> dict:
    """What fully_shard made of the model: its units, the placements, this rank's share."""
    from torch.distributed.tensor import DTensor

    params = list(model.parameters())
    from torch.distributed.fsdp import FSDPModule

    return {"fsdp_units": fsdp_units(model), "num_blocks": len(blocks(model)),
            "block_units": sum(isinstance(b, FSDPModule) for b in blocks(model)),
            "placements": sorted({str(p.placements) for p in params if isinstance(p, DTensor)}),
            "dtensor_params": sum(isinstance(p, DTensor) for p in params),
            "num_tensors": len(params),
            "local_param_bytes": sum(p.to_local().numel() * p.element_size()
                                     if isinstance(p, DTensor) else p.numel() * p.element_size()
                                     for p in params),
            # a DTensor's numel() is the global one
            "full_param_bytes": sum(p.numel() * p.element_size() for p in params)}


def one_step(model, optimizer, data, cfg, env, step: int) -> float:
    """One training step on step ``step``'s batch; the loss over all ranks."""
    from fsdp_course.dist import mean_over_ranks

    x, y = data.batch(step, env.rank, env.world_size, cfg.batch_size, cfg.seq_len, env.device)
    loss = lm_loss(model(x).logits, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return mean_over_ranks(loss)


def read_safetensors(folder: Path) -> dict:
    """Every tensor of a Hugging Face checkpoint folder (one file or an index of several)."""
    from safetensors.torch import load_file

    state = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        state.update(load_file(file))
    return state


def fresh_folder(path: str, env) -> Path:
    """``path`` without what an earlier run wrote there (rank 0 removes it; all ranks wait)."""
    import shutil

    import torch.distributed as dist

    out = Path(path)
    if env.is_rank0:
        for name in ("dcp", "hf_full", "hf_dcp", "logits.pt"):
            target = out / name
            if target.is_dir():
                shutil.rmtree(target, ignore_errors=True)
            else:
                target.unlink(missing_ok=True)
        out.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    return out


def files(folder: Path) -> list[dict]:
    return [{"name": p.relative_to(folder).as_posix(), "bytes": p.stat().st_size}
            for p in sorted(Path(folder).rglob("*")) if p.is_file()]


def compare_with_from_pretrained(model, folder: Path, probe: torch.Tensor, env, dtype) -> dict:
    """Collective: the sharded model's full tensors and logits against ``from_pretrained``
    (loaded by rank 0 in ``dtype``, the dtype the sharded model computes in)."""
    from transformers import AutoModelForCausalLM

    full = get_full(model)
    with torch.no_grad():
        logits = model(probe).logits.float()
    if not env.is_rank0:
        return {}
    same = sum(torch.equal(full[name], tensor) for name, tensor in
               AutoModelForCausalLM.from_pretrained(folder).state_dict().items())
    plain = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    with torch.no_grad():
        plain_logits = plain(probe.cpu()).logits.float()
    return {"tensors": len(full), "tensors_equal": same,
            "logits_max_diff": (logits.cpu() - plain_logits).abs().max().item()}


def get_full(model) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)
