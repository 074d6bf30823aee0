"""Will my model fit? Per-rank memory of one training step, before you rent the GPUs.

    python -m fsdp_course.plan --params 7e9 --world-size 8 --strategy FULL_SHARD \\
        --precision bf16-mixed --optimizer adamw --gpu-gib 80
    python -m fsdp_course.plan --hf-config lessons/09_your_model/configs/llama3-8b.json \\
        --world-size 8 --precision bf16-mixed --seq 4096 --gpu-gib 80
    python -m fsdp_course.plan --model course-gpt-7b --world-size 8 --precision bf16-mixed \\
        --activation-checkpointing full --gpu-gib 40
    python -m fsdp_course.plan --model course-gpt-default --world-size 2 --json
    python -m fsdp_course.plan --params 7e9 --world-size 8 --zero-stage 3

Prints the model state per rank (sharded parameters, gradients, optimizer state) in GB (1e9
bytes, as papers and vendors print it) with GiB beside, then every category per rank in GiB
(gathered parameters, activations, ...) at the three moments of a step (end of forward,
backward, optimizer step), the peak, an allowance for what the model leaves out, and whether
it fits on a GPU of ``--gpu-gib``; if not, the smallest world size and the settings that would
fit. The formulas, with their derivations, are in ``fsdp_course/theory/memory.py``; lesson 7
checks them against measured runs.

The model, one of:
  --hf-config PATH  a Hugging Face config.json (or its folder): llama, mistral, qwen2, gpt2.
                    Every parameter's shape from the config, so the count is exact (the tests
                    check it against transformers); activations as those models save them
                    (fsdp_course/theory/decoders.py). fully_shard per decoder layer, then the
                    root. --seq (default: the model's maximum, at most 2048) and --batch apply.
  --model NAME      one of the course's GPTs.
  --layers --hidden the course's GPT at these sizes (--heads --vocab --seq optional).
  --params N        exactly N parameters: the model state counts N; activations and units come
                    from a 32-block GPT of about that size (its width printed).
Bad input (a flag, a config field the planner cannot read): one line and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fsdp_course.theory import decoders, memory

GIB = 1024**3


def _course_default():
    from fsdp_course.config import TrainConfig
    from fsdp_course.data import load_data

    cfg = TrainConfig()
    return memory.GPTShape(
        load_data(None).vocab_size, cfg.seq_len, cfg.d_model, cfg.n_layers, cfg.n_heads
    )


# The course's models by name: name -> (a function giving its shape, its batch per rank).
MODELS = {
    "course-gpt-default": _course_default,  # every lesson's default GPT (~0.8M parameters)
    "course-gpt-limit": lambda: memory.GPTShape(
        _course_default().vocab, 64, 256, 8, 4
    ),  # lesson 7's limit demo
    "course-gpt-7b": lambda: memory.GPTShape(32000, 2048, 4096, 32, 32),  # 6.7B, LLaMA-7B sizes
}
MODEL_BATCH = {"course-gpt-default": 8, "course-gpt-limit": 4, "course-gpt-7b": 1}


class PlanError(Exception):
    """Bad input: reported as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        raise PlanError(message)


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(float(text)) if kind is int and "e" in text.lower() else kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value != value or value <= 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="python -m fsdp_course.plan",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    model = p.add_argument_group(
        "the model (one of --hf-config, --model, --params, --layers and --hidden)"
    )
    model.add_argument("--model", choices=sorted(MODELS), help="one of the course's models")
    model.add_argument(
        "--hf-config",
        metavar="PATH",
        help="a Hugging Face config.json, or the folder holding it (model_type "
        f"{', '.join(decoders.FAMILIES)}): the exact parameter count from its "
        "sizes; --seq and --batch apply, the other sizes come from the config",
    )
    model.add_argument(
        "--params",
        type=_positive(float),
        help="parameter count, e.g. 7.5e9: the state counts exactly this many",
    )
    model.add_argument("--layers", type=_positive(int), help="transformer blocks")
    model.add_argument("--hidden", type=_positive(int), help="model width")
    model.add_argument(
        "--heads", type=_positive(int), help="attention heads (default: hidden / 128)"
    )
    model.add_argument("--vocab", type=_positive(int), help="vocabulary size (default 32000)")
    model.add_argument("--seq", type=_positive(int), help="tokens per sequence (default 2048)")
    run = p.add_argument_group("the run")
    run.add_argument("--batch", type=_positive(int), help="sequences per rank per step (default 1)")
    run.add_argument("--world-size", type=_positive(int), default=8, help="ranks (GPUs)")
    run.add_argument("--strategy", default="FULL_SHARD", help=", ".join(memory.STRATEGIES))
    run.add_argument(
        "--api", default="fsdp2", help="fsdp2 (fully_shard) or classic (FullyShardedDataParallel)"
    )
    run.add_argument("--precision", default="fp32", help=", ".join(memory.PRECISIONS))
    run.add_argument("--optimizer", default="adamw", help=", ".join(memory.OPTIMIZER_SLOTS))
    run.add_argument(
        "--no-foreach",
        action="store_true",
        help="AdamW steps tensor by tensor (the CPU default) instead of foreach",
    )
    run.add_argument("--activation-checkpointing", default="none", metavar="none|full|every-K")
    run.add_argument(
        "--gpu-gib", type=_positive(float), help="memory per GPU, GiB: says fits or not"
    )
    run.add_argument(
        "--zero-stage",
        type=int,
        choices=(0, 1, 2, 3),
        help="also print the ZeRO paper's accounting for this stage",
    )
    run.add_argument("--json", action="store_true", help="the same figures as one JSON object")
    return p


def shape_from(args) -> tuple[memory.GPTShape, int, list[str]]:
    """The model's shape, the batch per rank, and notes on the plan's assumptions, from
    --hf-config, --model, --params, or the sizes."""
    sizes = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "vocab", "seq")}
    if args.hf_config:
        given = [
            f"--{k}"
            for k in ("model", "params", "layers", "hidden", "heads", "vocab")
            if getattr(args, k)
        ]
        if given:
            raise PlanError(f"--hf-config gives the model's sizes: drop {', '.join(given)}")
        shape, cfg = read_hf_config(args.hf_config, args.seq)
        return shape, args.batch or 1, decoders.notes(cfg, shape)
    if args.model:
        if args.params:
            raise PlanError("give --model or --params, not both")
        base = MODELS[args.model]()
        values = {
            "layers": base.layers,
            "hidden": base.hidden,
            "heads": base.heads,
            "vocab": base.vocab,
            "seq": base.seq,
        }
        values.update({k: v for k, v in sizes.items() if v})
        batch = args.batch or MODEL_BATCH[args.model]
    elif args.params:  # exactly this many parameters; the sizes given shape the assumed GPT
        shape = memory.model_for_params(
            args.params,
            layers=sizes["layers"] or 32,
            vocab=sizes["vocab"] or 32000,
            seq=sizes["seq"] or 2048,
            heads=sizes["heads"],
            hidden=sizes["hidden"],
        )
        return shape, args.batch or 1, []
    elif sizes["hidden"] and sizes["layers"]:
        values = {"vocab": 32000, "seq": 2048, **{k: v for k, v in sizes.items() if v}}
        values.setdefault("heads", max(1, values["hidden"] // 128))
        batch = args.batch or 1
    else:
        raise PlanError("say which model: --model NAME, --params N, or --layers and --hidden")
    shape = memory.GPTShape(
        values["vocab"], values["seq"], values["hidden"], values["layers"], values["heads"]
    )
    return shape, batch, []


def read_hf_config(path: str, seq: int | None = None) -> tuple[decoders.DecoderShape, dict]:
    """The model a config.json describes, and the config itself (read with json only)."""
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    if not file.is_file():
        raise PlanError(f"--hf-config {path}: no config.json there")
    try:
        cfg = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PlanError(f"--hf-config {file}: not a JSON file ({exc})") from None
    try:
        return decoders.from_hf_config(cfg, seq), cfg
    except decoders.ConfigError as exc:
        raise PlanError(f"--hf-config {file}: {exc}") from None


def suggestions(shape, batch: int, settings: dict, gpu_bytes: float) -> list[str]:
    """Settings that would fit, cheapest in communication first (one line each)."""
    tries = [
        ("activation checkpointing (full)", {"ac": "full"}),
        ("bf16 mixed precision", {"precision": "bf16-mixed"}),
        (
            "bf16 mixed precision + full activation checkpointing",
            {"precision": "bf16-mixed", "ac": "full"},
        ),
        ("FULL_SHARD", {"strategy": "FULL_SHARD"}),
        ("FULL_SHARD + full activation checkpointing", {"strategy": "FULL_SHARD", "ac": "full"}),
    ]
    found, tried = [], [settings]
    for text, change in tries:
        candidate = {**settings, **change}
        if candidate in tried:  # already the setting, or the same as an earlier try
            continue
        tried.append(candidate)
        result = memory.plan(shape, batch, gpu_bytes=gpu_bytes, **candidate)
        if result["fits"]:
            found.append(
                f"{text}: peak {result['needed'] / GIB:.2f} GiB with allowance, "
                f"sends {result['wire_bytes'] / GIB:.2f} GiB per rank per step"
            )
    smallest = memory.smallest_world_size(
        shape, batch, gpu_bytes, **{k: v for k, v in settings.items() if k != "world_size"}
    )
    if smallest:
        found.append(f"the same settings on {smallest} ranks (the smallest power of two that fits)")
    return found


def describe(shape) -> str:
    """The model line: the parameter count, exact, and where the layout comes from."""
    gpt = (
        f"{shape.layers} blocks, hidden {shape.hidden}, {shape.heads} heads, vocab {shape.vocab}, "
        f"seq {shape.seq}"
    )
    if isinstance(shape, memory.CountedShape):
        return (
            f"{shape.num_params:,} parameters ({shape.num_params / 1e9:.3f}B, as given: the state "
            f"counts exactly these; activations and units from a GPT of {gpt})"
        )
    if isinstance(shape, memory.GPTShape):
        return f"{shape.num_params:,} parameters ({shape.num_params / 1e9:.3f}B; GPT: {gpt})"
    return f"{shape.num_params:,} parameters ({shape.num_params / 1e9:.3f}B; {shape.describe()})"


def state_lines(state: dict, title: str) -> list[str]:
    """Model state per rank in GB (1e9 bytes: how papers and vendors print it), GiB beside."""
    rows = [(k, state[k]) for k in ("params", "grads", "optimizer")]
    rows.append(("total", sum(v for _, v in rows)))
    return [f"{title:34s}{'GB':>9}{'GiB':>9}"] + [
        f"  {k:32s}{v / 1e9:9.3f}{v / GIB:9.3f}" for k, v in rows
    ]


def report(result: dict, shape, zero: dict | None, tips: list[str]) -> str:
    r, g = result, lambda b: f"{b / GIB:10.3f}"
    lines = [
        f"model: {describe(shape)}; batch {r['batch']} per rank",
        f"run:   {r['strategy']} on {r['world_size']} ranks ({r['api']}), {r['precision']}, "
        f"{r['optimizer']}, activation checkpointing {r['activation_checkpointing']}",
        "",
        *state_lines(r["categories"], "model state per rank"),
        "",
        "per rank, GiB                       forward   backward  optimizer",
    ]
    names = ("params", "grads", "optimizer", "buffers", "gathered", "activations", "working")
    for name in names:
        lines.append(
            f"  {name:30s}" + "".join(g(r["moments"][m].get(name, 0)) for m in r["moments"])
        )
    lines.append(f"  {'total':30s}" + "".join(g(r["totals"][m]) for m in r["moments"]))
    lines += [
        "",
        f"peak      {r['peak'] / GIB:.3f} GiB per rank ({r['peak_moment']})",
        f"allowance {r['allowance'] / GIB:.3f} GiB (allocator, fragmentation, workspaces: "
        f"{memory.ALLOWANCE_FRACTION:.0%} of the peak)",
        f"needed    {r['needed'] / GIB:.3f} GiB per rank",
        f"sends     {r['wire_bytes'] / GIB:.3f} GiB per rank per step",
    ]
    if "fits" in r:
        verdict = "fits" if r["fits"] else "does NOT fit"
        lines.append(f"verdict   {verdict} on a GPU of {r['gpu_bytes'] / GIB:g} GiB")
        if not r["fits"]:
            lines += ["what would fit:"] + [
                f"  - {t}" for t in tips or ["nothing tried fits: more ranks, a smaller batch"]
            ]
    if zero:
        lines += [
            "",
            *state_lines(zero, f"ZeRO stage {zero['stage']} per rank (N_d = {r['world_size']})"),
            "  (the paper's mixed-precision Adam, K = 12: 2 + 2 + 12 bytes per parameter; FSDP "
            "above: 4 + 4 + 8.",
            "   Stage 3 ~ FULL_SHARD; stage 2 ~ SHARD_GRAD_OP, which also keeps the gathered "
            "parameters from forward to backward)",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        shape, batch, notes = shape_from(args)
        settings = {
            "world_size": args.world_size,
            "strategy": args.strategy,
            "api": args.api,
            "precision": args.precision,
            "optimizer": args.optimizer,
            "ac": args.activation_checkpointing,
            "foreach": not args.no_foreach,
        }
        gpu_bytes = args.gpu_gib * GIB if args.gpu_gib else None
        result = memory.plan(shape, batch, gpu_bytes=gpu_bytes, **settings)
    except (PlanError, ValueError) as exc:
        print(f"python -m fsdp_course.plan: error: {exc}", file=sys.stderr)
        return 2
    zero = None
    if args.zero_stage is not None:
        zero = {
            "stage": args.zero_stage,
            **memory.zero_stage_bytes(shape.num_params, args.world_size, args.zero_stage),
        }
        result["zero"] = zero
    tips = (
        suggestions(shape, batch, settings, gpu_bytes) if gpu_bytes and not result["fits"] else []
    )
    if args.json:
        result["suggestions"] = tips
        result["notes"] = notes
        print(json.dumps(result))
    else:
        print("\n".join([report(result, shape, zero, tips), *notes]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
