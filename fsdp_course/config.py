"""One dataclass per script, turned into argparse flags by one small helper.

    @dataclass
    class Config(TrainConfig):
        steps: int = flag(20, "optimizer steps")
        wrap: Wraps = flag(Wraps("transformer"), "wrap policies, one run each", parse=Wraps)

    cfg = parse_config(Config, __doc__)
    for run_cfg, label in plan_runs(cfg): ...   # the command line's run, then each --variants'

Field ``my_flag`` becomes ``--my-flag``; a bool becomes ``--my-flag / --no-my-flag``. A field
whose metadata has ``"parse": fn`` is parsed by ``fn(text)``: a list flag by its ``list_flag``
type (``--wrap none,size:20000`` -> ``Wraps(("none", "size:20000"))``, checked), a count with a
floor by ``int_at_least(1)``. A setting becomes its value here, once, where the command line is
read; the scripts pass values on, never the text. The default is used as given.
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


def flag(default, help: str, choices=None, **more) -> dataclasses.Field:
    """A config field in one line: its default, its help text, the values it takes (argparse's
    ``choices``), and more metadata (``parse=``, ``metavar=``)."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices, **more})


class ListFlag(tuple):
    """The value of a list flag, parsed once where the config is read: argparse calls the type on
    the text (``"none,size:20000"``), and so does ``with_variant``. Each comma-separated item is
    folded (``fold``: str.lower by default), read by ``item`` and kept in order. A bad item is
    argparse's one-line error: the item named with ``expected``, or, where the type has no
    ``expected`` of its own (``item_says``), the ArgumentTypeError ``item`` raised. It
    prints as typed (``show`` writes an item back). Make one with ``list_flag``."""

    expected = "comma-separated values"
    item_says = False
    fold = staticmethod(str.lower)
    item = staticmethod(str)
    show = staticmethod(str)

    def __new__(cls, text=()):
        if not isinstance(text, str):  # values already read (a default, dataclasses.asdict's copy)
            return super().__new__(cls, text)
        values = []
        for word in filter(None, (w.strip() for w in text.split(","))):
            try:
                values.append(cls.item(cls.fold(word)))
            except argparse.ArgumentTypeError:
                if cls.item_says:
                    raise
                raise argparse.ArgumentTypeError(f"{word!r}: {cls.expected}") from None
            except (KeyError, ValueError):
                raise argparse.ArgumentTypeError(f"{word!r}: {cls.expected}") from None
        if not values:
            raise argparse.ArgumentTypeError(f"{text!r}: {cls.expected}")
        return super().__new__(cls, values)

    def __str__(self) -> str:
        return ",".join(map(self.show, self))


def list_flag(
    name: str, choices=(), item=None, *, expected: str | None = None, show=str, fold=str.lower
) -> type[ListFlag]:
    """A list flag's type: ``Wraps = list_flag("Wraps", WRAPS)`` takes names from ``choices``;
    ``item`` (text -> value, ValueError for a bad one) reads other items (numbers, on/off), with
    ``show`` to write one back and ``expected`` to say what a bad one should have been (left
    out, an ``item`` that raises ArgumentTypeError says it: ``int_at_least(2)``)."""
    if item is None:

        def item(word: str) -> str:
            if word not in choices:
                raise ValueError(word)
            return word

    item_says = expected is None and not choices
    if expected is None:
        expected = (
            f"choose from {', '.join(map(str, choices))}, several separated by commas"
            if choices
            else "comma-separated values"
        )
    members = {
        "expected": expected,
        "item_says": item_says,
        "item": staticmethod(item),
        "show": staticmethod(show),
        "fold": staticmethod(fold or str),
        "__doc__": f"A list flag's value: {expected}.",
    }
    return type(name, (ListFlag,), members)


def list_help(kind: str, choices) -> str:
    """Help text of a list flag of names: what it lists, and the names it takes."""
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
    its flag: by the field's metadata ``"parse"`` (a list flag's type) as on the command line,
    else by its declared type (bool true/false, a number, ``none`` for a flag whose default is
    None), checked against the field's ``"choices"``. A list flag takes one value in a variant:
    commas separate the variant's changes. ValueError with one sentence for a flag that does not
    exist (or is in ``fixed``: a variant cannot change it) or a value of the wrong type."""
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    typed = {}
    for name, text in changes.items():
        flag = f"--{name.replace('_', '-')}"
        if name not in fields or name in fixed:
            raise ValueError(
                f"--variants: no flag {flag}" + (" in a variant" if name in fields else "")
            )
        field, kind = fields[name], _field_type(type(cfg), fields[name])
        if "parse" not in field.metadata and kind is bool:
            if text.lower() not in ("true", "false"):
                raise ValueError(f"--variants: {flag[2:]}={text}: write true or false")
            typed[name] = text.lower() == "true"
        elif "parse" not in field.metadata and kind in (int, float):
            try:
                typed[name] = kind(text)
            except ValueError:
                raise ValueError(f"--variants: {flag[2:]}={text}: not a number") from None
        elif "parse" not in field.metadata and field.default is None and text.lower() == "none":
            typed[name] = None
            continue
        else:  # the flag's own parser, as on the command line (str leaves the text as it is)
            try:
                typed[name] = _field_parser(type(cfg), field)(text)
            except (ValueError, argparse.ArgumentTypeError) as exc:
                raise ValueError(f"--variants: {flag[2:]}={text}: {exc}") from None
        choices = field.metadata.get("choices")
        if choices and typed[name] not in choices:  # what argparse checks on the command line
            raise ValueError(
                f"--variants: {flag[2:]}={text}: choose from {', '.join(map(str, choices))}"
            )
    return dataclasses.replace(cfg, variants=None, **typed)


def plan_runs(cfg, fixed: tuple[str, ...] = ("variants", "metrics"), *, with_base: bool = True):
    """The configs one launch runs, labelled: ``[(config, label), ...]``. The command line's
    config (label None), then one per ``--variants`` entry: the command line's with the entry's
    flags changed (``with_variant``), labelled as typed, ``(wrap=transformer,prefetch=post)``.
    ``with_base=False``: the variants replace the command line's run (it still runs alone when
    there are none). All are read before anything runs: a variant naming no flag, one in
    ``fixed``, or a bad value is a CourseError (one line, exit 2). A script then runs each
    config once per value of its list flags."""
    from fsdp_course.dist import CourseError

    runs = [(cfg, None)] if with_base or not cfg.variants else []
    for changes in cfg.variants or ():
        try:
            runs.append((with_variant(cfg, changes, fixed), str(changes)))
        except ValueError as exc:
            raise CourseError(str(exc)) from None
    return runs


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
