"""One dataclass per script, turned into argparse flags by one small helper.

    @dataclass
    class Config:
        steps: int = field(default=20, metadata={"help": "optimizer steps"})
        strategy: str = field(default="FULL_SHARD", metadata={"choices": STRATEGIES})

    cfg = parse_config(Config, __doc__)

Field ``my_flag`` becomes ``--my-flag``; a bool becomes ``--my-flag / --no-my-flag``. A field
whose metadata has ``"parse": fn`` is parsed by ``fn(text)`` (e.g. a comma-separated list into a
tuple of checked names: ``names_from(CHOICES)``; a count with a floor: ``int_at_least(1)``);
the default is used as given.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import types
import typing


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def _field_type(cls, field: dataclasses.Field):
    hints = typing.get_type_hints(cls)
    return hints.get(field.name, type(field.default))


def _field_parser(cls, field: dataclasses.Field):
    """What turns a flag's text into the field's value, on the command line and in a variant.
    A field may bring its own parser (metadata "parse": text -> value, raising ValueError or
    argparse.ArgumentTypeError with a message): list flags like "--strategy A,B" are turned into
    typed values here, once, instead of in each script. Else its type parses it ("str | None"
    and friends: the first type that is not None)."""
    if "parse" in field.metadata:
        return field.metadata["parse"]
    kind = _field_type(cls, field)
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        kind = next(arg for arg in typing.get_args(kind) if arg is not type(None))
    return kind


def build_parser(cls, doc: str | None = None) -> argparse.ArgumentParser:
    prog = sys.argv[0].rsplit("/", 1)[-1] if sys.argv and sys.argv[0] else None
    parser = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=_Formatter)
    for field in dataclasses.fields(cls):
        flag = "--" + field.name.replace("_", "-")
        help_text = field.metadata.get("help", " ")
        default = (
            field.default if field.default is not dataclasses.MISSING else field.default_factory()
        )
        if _field_type(cls, field) is bool:
            parser.add_argument(
                flag, action=argparse.BooleanOptionalAction, default=default, help=help_text
            )
            continue
        parser.add_argument(
            flag,
            type=_field_parser(cls, field),
            default=default,
            help=help_text,
            choices=field.metadata.get("choices"),
            metavar=field.metadata.get("metavar"),
        )
    return parser


def names_from(choices):
    """The parser of a list flag: "a,b" -> ("a", "b"), each checked against ``choices``."""

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(name.strip() for name in text.split(",") if name.strip())
        if not names:
            raise argparse.ArgumentTypeError(f"give at least one of {', '.join(choices)}")
        for name in names:
            if name not in choices:
                raise argparse.ArgumentTypeError(f"{name}: choose from {', '.join(choices)}")
        return names

    parse.__name__ = "list"  # argparse names the parser in its message: "invalid list value"
    return parse


def list_help(kind: str, choices) -> str:
    """Help text of a ``names_from`` flag: what it lists, and the names it takes."""
    return f"{kind}: comma-separated, from {', '.join(choices)}"


def int_at_least(low: int):
    """The parser of an integer flag with a floor: "0" -> error "must be at least 1"."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value

    parse.__name__ = "int"
    return parse


class Variant(dict):
    """One variant's flag changes ({field: text}); prints as typed, in parentheses."""

    def __str__(self) -> str:
        return "(" + ",".join(f"{k.replace('_', '-')}={v}" for k, v in self.items()) + ")"


def parse_variants(text: str) -> tuple[Variant, ...]:
    """The parser of a ``--variants`` flag: several runs in one launch, each the command line's
    config with some flags changed. ``"mixed-precision=true;strategy=DDP,steps=5"`` -> one
    Variant per run (``;`` between runs, ``,`` between flag=value pairs); ``with_variant``
    makes each one a config."""
    variants = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        changes = Variant()
        for item in filter(None, (i.strip() for i in part.split(","))):
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise argparse.ArgumentTypeError(
                    f"cannot read {item!r}: write flag=value, e.g. steps=5"
                )
            changes[key.strip().lstrip("-").replace("-", "_")] = value.strip()
        variants.append(changes)
    if not variants:
        raise argparse.ArgumentTypeError("no variant given")
    return tuple(variants)


def with_variant(cfg, changes: dict, fixed: tuple[str, ...] = ("variants", "metrics")):
    """``cfg`` (a config with a ``variants`` field) with a variant's changes, each value typed like
    its flag: bool true/false, else parsed as the command line parses it (the field's metadata
    ``"parse"`` or its type, like a list flag's), checked against the field's ``"choices"``. A
    list flag takes one value in a variant: commas separate the variant's changes.
    ValueError with one sentence for a flag that does not exist (or is in ``fixed``: a variant
    cannot change it) or a value of the wrong type."""
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    typed = {}
    for name, text in changes.items():
        flag = f"--{name.replace('_', '-')}"
        if name not in fields or name in fixed:
            raise ValueError(
                f"--variants: no flag {flag}" + (" in a variant" if name in fields else "")
            )
        current = getattr(cfg, name)
        if isinstance(current, bool):
            if text.lower() not in ("true", "false"):
                raise ValueError(f"--variants: {flag[2:]}={text}: write true or false")
            typed[name] = text.lower() == "true"
        elif isinstance(current, (int, float)) and "parse" not in fields[name].metadata:
            try:
                typed[name] = type(current)(text)
            except ValueError:
                raise ValueError(f"--variants: {flag[2:]}={text}: not a number") from None
        else:  # the flag's own parser, as on the command line (str leaves the text as it is)
            try:
                typed[name] = _field_parser(type(cfg), fields[name])(text)
            except (ValueError, argparse.ArgumentTypeError) as exc:
                raise ValueError(f"--variants: {flag[2:]}={text}: {exc}") from None
        choices = fields[name].metadata.get("choices")
        if choices and typed[name] not in choices:  # what argparse checks on the command line
            raise ValueError(
                f"--variants: {flag[2:]}={text}: choose from {', '.join(map(str, choices))}"
            )
    return dataclasses.replace(cfg, variants=None, **typed)


FLAGS_GRACE_S = 30.0


def parse_config(cls, doc: str | None = None, argv: list[str] | None = None):
    """Parse ``argv`` (default ``sys.argv[1:]``) into an instance of dataclass ``cls``.

    Bad flags exit 2 with argparse's one-line message; ``--help`` prints every flag with its
    default and the script's docstring (which gives the launch command).
    """
    parser = build_parser(cls, doc)
    rank = int(os.environ.get("RANK", "0"))
    if rank != 0:
        # Under torchrun every rank parses the same flags: rank 0 alone prints help or the
        # error, and torchrun stops the others as soon as it has exited. They wait for that
        # longer than dist.leave_after_rank0 does: ranks parse before they join, and on a busy
        # machine rank 0 may still be importing torch many seconds after this rank. A rank
        # that is still there after the wait says the error itself, in one write.
        parser._print_message = lambda message, file=None: None

        def error(message):
            from fsdp_course.dist import say

            time.sleep(FLAGS_GRACE_S)
            say(f"[rank {rank}] {parser.prog}: error: {message}")
            sys.exit(2)

        parser.error = error
    args = parser.parse_args(argv)
    return cls(**vars(args))


def describe(cfg) -> str:
    """The config on one line, echoed once by rank 0 (a list flag as it is typed: a,b)."""

    def shown(value):
        if isinstance(value, (tuple, list)) and type(value).__str__ is object.__str__:
            return ",".join(map(str, value))
        return value  # a list flag's own type says itself as typed (lesson 3's on,off)

    return " ".join(f"{k}={shown(v)}" for k, v in dataclasses.asdict(cfg).items())


@dataclasses.dataclass
class TrainConfig:
    """The flags every lesson script shares; a script subclasses it with its own flags:

        @dataclass
        class Config(TrainConfig):
            strategy: str = "FULL_SHARD"

    Each field is a flag (``seq_len`` is ``--seq-len``); its metadata holds the help text.
    """

    steps: int = dataclasses.field(default=20, metadata={"help": "optimizer steps"})
    batch_size: int = dataclasses.field(default=8, metadata={"help": "sequences per rank per step"})
    lr: float = dataclasses.field(default=3e-3, metadata={"help": "AdamW learning rate"})
    d_model: int = dataclasses.field(default=128, metadata={"help": "model width"})
    n_layers: int = dataclasses.field(default=4, metadata={"help": "transformer blocks"})
    n_heads: int = dataclasses.field(default=4, metadata={"help": "attention heads"})
    seq_len: int = dataclasses.field(default=64, metadata={"help": "tokens per sequence"})
    seed: int = dataclasses.field(default=0, metadata={"help": "the same on every rank"})
    data: str | None = dataclasses.field(
        default=None, metadata={"help": "train on this text file instead of the generated corpus"}
    )
    log_every: int = dataclasses.field(
        default=5, metadata={"help": "print a metric line every N steps"}
    )
    metrics: str | None = dataclasses.field(
        default=None, metadata={"help": "rank 0 writes the metrics JSON here"}
    )

    def model_config(self, vocab_size: int):
        """The GPT's sizes from these flags (the vocabulary comes from the data)."""
        from fsdp_course.model import ModelConfig

        return ModelConfig(vocab_size, self.seq_len, self.d_model, self.n_layers, self.n_heads)
