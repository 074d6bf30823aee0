"""The shared library on its own: process-group exits and timeouts under torchrun, whole lines
from ranks writing at once, the launcher's report of the rank that failed first, data
determinism, config flags, the theory's formulas."""

import re
import signal
import sys
import textwrap

import pytest
import torch

from fsdp_course import config as course_config
from fsdp_course import dist as course_dist
from fsdp_course import theory
from fsdp_course.config import parse_config
from fsdp_course.data import load_data
from fsdp_course.dist import CourseError
from fsdp_course.model import GPT, Block, ModelConfig, num_params
from helpers import run_cmd

# Lines each rank says at once in test_ranks_writing_at_once_write_whole_lines. Each line is a
# chance for another rank's write to land inside it, if it went out in two writes: with print()
# instead of say(), 3 of 8 launches of 4 ranks x 1,000 lines showed no broken line at all (the
# ranks took turns), none of 13 launches of 4 ranks x 3,000 lines did.
RACE_LINES = 3000

SCRIPT = textwrap.dedent(f"""
    import os
    import signal
    import sys
    import torch.distributed as dist
    from fsdp_course.dist import CourseError, distributed, say
    with distributed() as env:
        what = sys.argv[1]
        if what == "race":
            dist.barrier()
            for i in range({RACE_LINES}):
                say(f"[rank {{env.rank}}] line {{i}}, said while the other ranks talk too")
            dist.barrier()  # and now every rank fails at the same moment
            raise ValueError("something broke")
        if what == "sigkill":
            if env.rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(__import__("torch").ones(1))  # rank 0 loses its peer here
        if what == "course-error":
            if env.rank == 0:
                __import__("time").sleep(1)  # rank 1 gets there first: rank 0 must still speak
            raise CourseError("checkpoint was written by another model")
        if what == "bug":
            raise ValueError("something broke\\nsecond line of a long message")
        if what == "stuck":
            if env.rank == 0:
                dist.all_reduce(__import__("torch").ones(1))  # rank 1 never joins
            else:
                # then waits in the final barrier: rank 0 times out first
                __import__("time").sleep(1)
        env.print0("finished")
""")


def torchrun(tmp_path, *args, env=None, nproc=2, agent_flags=()):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    return run_cmd(
        [
            sys.executable,
            "-m",
            "fsdp_course.torchrun",
            *agent_flags,
            "--standalone",
            f"--nproc-per-node={nproc}",
            script,
            *args,
        ],
        env=env,
        timeout=120,
    )


# What the launcher's last line looks like after ranks exited on their own with code 1.
REPORT_EXIT_1 = (
    r"torchrun: rank \d exited with code 1; its message is above"
    r"(; after it, (rank \d exited with code 1(, )?)+)? \(COURSE_DEBUG=1 shows the agent's report\)"
)


def unexpected_lines(stderr: str, patterns: list[str]) -> list[str]:
    """The lines of ``stderr`` that are none of ``patterns`` (whole-line regular expressions)."""
    return [
        line
        for line in stderr.splitlines()
        if not any(re.fullmatch(pattern, line) for pattern in patterns)
    ]


def test_clean_run_exits_0_without_abort(tmp_path):
    proc = torchrun(tmp_path, "ok")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("finished") == 1  # rank 0 only
    assert "terminate called" not in proc.stderr


def test_course_error_is_one_line_and_exit_2(tmp_path):
    proc = torchrun(tmp_path, "course-error")
    assert proc.returncode == 2
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == [
        "error: checkpoint was written by another model"
    ]
    assert "Traceback" not in proc.stderr


def test_unexpected_exception_is_one_line_per_rank_and_exit_1(tmp_path):
    proc = torchrun(tmp_path, "bug")
    assert proc.returncode == 1
    errors = sorted(line for line in proc.stderr.splitlines() if "error: ValueError" in line)
    assert errors == [
        "[rank 0] error: ValueError: something broke",
        "[rank 1] error: ValueError: something broke",
    ], proc.stderr
    assert "second line" not in proc.stderr and "Traceback" not in proc.stderr


RACE_RANKS = 4


def test_ranks_writing_at_once_write_whole_lines(tmp_path):
    """Four ranks on one stderr, unbuffered as in CI (print() then writes a line's text and its
    newline separately): each says RACE_LINES lines at once, then all fail at the same moment.
    Every line must arrive whole, however the writes of the ranks fall (the collisions are up
    to the scheduler: enough lines that the ranks' turns overlap, see RACE_LINES)."""
    whole = [
        r"\[rank \d\] line \d+, said while the other ranks talk too",
        r"\[rank \d\] error: ValueError: something broke",
        r"\[rank \d\] \(set COURSE_DEBUG=1 for the full traceback\)",
        REPORT_EXIT_1,
    ]
    proc = torchrun(tmp_path, "race", env={"PYTHONUNBUFFERED": "1"}, nproc=RACE_RANKS)
    assert proc.returncode == 1, proc.stderr
    broken = unexpected_lines(proc.stderr, whole)
    assert not broken, f"lines broken by another rank's write: {broken[:4]}"
    for rank in range(RACE_RANKS):
        said = [
            line for line in proc.stderr.splitlines() if line.startswith(f"[rank {rank}] line ")
        ]
        assert said == [
            f"[rank {rank}] line {i}, said while the other ranks talk too"
            for i in range(RACE_LINES)
        ], f"rank {rank}"
    assert "] error: ValueError: something broke" in proc.stderr


def test_say_writes_a_line_and_its_newline_in_one_write(tmp_path, monkeypatch):
    writes = []
    real_write = course_dist.os.write
    monkeypatch.setattr(
        course_dist.os, "write", lambda fd, data: writes.append(data) or real_write(fd, data)
    )
    with open(tmp_path / "out.txt", "w") as stream:
        stream.write("printed before, still buffered: ")
        course_dist.say("one line", stream)
        course_dist.say("ünïcode too", stream)
    assert writes == [b"one line\n", "ünïcode too\n".encode()]
    assert (
        tmp_path / "out.txt"
    ).read_text() == "printed before, still buffered: one line\nünïcode too\n"


def test_a_stuck_collective_fails_in_bounded_time(tmp_path):
    """Bounded by COURSE_TIMEOUT_S, not the default 30 minutes: the message names the 3 s."""
    proc = torchrun(tmp_path, "stuck", env={"COURSE_TIMEOUT_S": "3"})
    assert proc.returncode == 1
    # Rank 0 waits in its all_reduce, rank 1 (a second later) in the barrier that ends the run:
    # rank 0 times out first, says so in one line that names the setting, and is the rank the
    # launcher names. Rank 1 then loses its peer: it waits, and is mostly stopped before it says
    # so; no traceback either way.
    timed_out = (
        r"\[rank 0\] error: RuntimeError: .*Timed out.*  \(a rank waited more than "
        r"COURSE_TIMEOUT_S=3 s for a collective that another rank never joined\)"
    )
    lines = proc.stderr.splitlines()
    assert re.fullmatch(timed_out, lines[0]), proc.stderr
    assert lines[-1].startswith("torchrun: rank 0 exited with code 1; its message is above")
    assert not unexpected_lines(
        proc.stderr,
        [
            timed_out,
            r"\[rank 1\] error: could not leave the process group together: RuntimeError: .+",
            r"\[rank [01]\] \(set COURSE_DEBUG=1 for the full traceback\)",
            REPORT_EXIT_1,
        ],
    ), proc.stderr


def test_bad_timeout_setting_is_refused(tmp_path):
    proc = torchrun(tmp_path, "ok", env={"COURSE_TIMEOUT_S": "soon"})
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert lines[0] == "COURSE_TIMEOUT_S must be a positive number of seconds, got 'soon'"
    # said once, by rank 0
    assert lines[1:] == [
        "torchrun: rank 0 exited with code 2; its message is above "
        "(COURSE_DEBUG=1 shows the agent's report)"
    ]


def test_a_killed_rank_is_named_not_the_peer_that_lost_it(tmp_path):
    """Rank 1 dies by SIGKILL; rank 0's all_reduce fails on the broken connection. The launcher
    names rank 1 and its signal (rank 0 waits a second before it leaves: mostly the agent stops
    it first; test_root_cause_of_a_failed_run covers the agent finding both exits at once)."""
    proc = torchrun(tmp_path, "sigkill")
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr
    assert re.fullmatch(
        r"torchrun: rank 1 was killed by SIGKILL \(signal 9\)(; after it, rank 0 "
        r"exited with code 1)? \(COURSE_DEBUG=1 shows the agent's report\)",
        proc.stderr.splitlines()[-1],
    ), proc.stderr
    assert not unexpected_lines(
        "\n".join(proc.stderr.splitlines()[:-1]),
        [
            r"\[rank 0\] error: RuntimeError: .*by peer.*",
            r"\[rank 0\] \(set COURSE_DEBUG=1 for the full traceback\)",
        ],
    ), proc.stderr


def failure(rank: int, exitcode: int, stamp: int):
    """A ProcessFailure as the agent builds it when it notices a rank's exit (no error file)."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    result = ProcessFailure(
        local_rank=rank, pid=1000 + rank, exitcode=exitcode, error_file="/nonexistent/error.json"
    )
    result.timestamp = stamp
    return result


def test_root_cause_of_a_failed_run():
    from fsdp_course.torchrun import report, root_cause

    def cause(*failures):
        return root_cause({f.local_rank: f for f in failures})[0]

    kill, term = -signal.SIGKILL, -signal.SIGTERM
    # A rank killed by a signal, its peer's consequent exit 1 stamped the same second (or the
    # next: the agent's whole seconds can tick between the two).
    assert cause(failure(0, 1, 100), failure(1, kill, 100)) == 1
    assert cause(failure(0, 1, 100), failure(1, kill, 101)) == 1
    # Bad input on rank 0; the agent stops rank 1 with SIGTERM, even in an earlier second.
    assert cause(failure(0, 2, 101), failure(1, term, 100)) == 0
    # A bug on rank 1; rank 0 lost its peer and left a second later.
    assert cause(failure(0, 1, 101), failure(1, 1, 100)) == 1
    # A signal long after the first failure (the agent's SIGKILL when SIGTERM was not enough).
    assert cause(failure(0, 1, 100), failure(1, kill, 131)) == 0
    line, code = report({0: failure(0, 1, 100), 1: failure(1, kill, 100), 2: failure(2, term, 100)})
    assert line == (
        "torchrun: rank 1 was killed by SIGKILL (signal 9); after it, rank 0 exited "
        "with code 1 (COURSE_DEBUG=1 shows the agent's report)"
    )
    assert code == 137


def test_global_batch_is_the_union_of_rank_batches():
    data = load_data(seed=3)
    x_all, y_all = data.batch(5, 0, 1, 6, 16)
    parts = [data.batch(5, r, 3, 2, 16) for r in range(3)]
    assert torch.equal(torch.cat([p[0] for p in parts]), x_all)
    assert torch.equal(torch.cat([p[1] for p in parts]), y_all)
    assert torch.equal(y_all[:, :-1], x_all[:, 1:])  # targets are the next characters
    assert not torch.equal(data.batch(6, 0, 1, 6, 16)[0], x_all)


def test_data_from_a_text_file(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("hello fsdp world. " * 100)
    data = load_data(str(text))
    assert data.vocab == "".join(sorted(set("hello fsdp world. ")))
    assert data.decode(data.tokens[:5].tolist()) == "hello"
    with pytest.raises(CourseError, match="no such file"):
        load_data(str(tmp_path / "missing.txt"))


def test_config_flags_from_a_dataclass():
    from dataclasses import dataclass, field

    @dataclass
    class Config:
        steps: int = 3
        mixed_precision: bool = False
        strategy: str = field(
            default="FULL_SHARD", metadata={"choices": ["FULL_SHARD", "NO_SHARD"]}
        )
        data: str | None = None

    cfg = parse_config(Config, argv=["--steps", "7", "--mixed-precision", "--strategy", "NO_SHARD"])
    assert (cfg.steps, cfg.mixed_precision, cfg.strategy, cfg.data) == (7, True, "NO_SHARD", None)
    with pytest.raises(SystemExit) as exc:
        parse_config(Config, argv=["--strategy", "ZERO9"])
    assert exc.value.code == 2


def test_bad_flag_on_another_rank_waits_then_says_it_whole(monkeypatch, capfd):
    """Under torchrun rank 0 prints argparse's error; another rank stays silent for
    FLAGS_GRACE_S (torchrun has stopped it by then), and only if it is still there says the
    error itself, as one line with its rank."""
    from dataclasses import dataclass

    @dataclass
    class Config:
        steps: int = 3

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(course_config, "FLAGS_GRACE_S", 0.0)
    monkeypatch.setattr(sys, "argv", ["train.py"])
    with pytest.raises(SystemExit) as exc:
        parse_config(Config, argv=["--steps", "many"])
    assert exc.value.code == 2
    out, err = capfd.readouterr()
    assert (out, err) == (
        "",
        "[rank 1] train.py: error: argument --steps: invalid int value: 'many'\n",
    )


def test_unit_numels_and_padding_theory():
    model = GPT(ModelConfig(vocab_size=27))
    units = theory.fsdp_unit_numels(model, Block)
    assert len(units) == 5 and sum(units) == num_params(model)
    assert theory.shard_numel(10, 4) == 3 and theory.shard_numel(8, 4) == 2
    assert theory.model_state_bytes([10], 4, "FULL_SHARD") == {
        "params": 12,
        "grads": 12,
        "optimizer": 24,
    }
    assert theory.model_state_bytes([10], 4, "NO_SHARD") == theory.ddp_state_bytes(10)
    assert theory.collective_bytes([8, 4], 2, "FULL_SHARD") == {
        "all_gather": 4 * (8 + 4 + 4),
        "reduce_scatter": 4 * 12,
    }
    assert theory.ring_sent_bytes("all_reduce", 100, 4) == 150


def test_config_field_with_its_own_parser():
    """A list flag is parsed once, by the field's own parser; a bad value is argparse's one line."""
    import argparse
    from dataclasses import dataclass, field

    from fsdp_course.config import parse_config

    def strategies(text):
        names = tuple(part.strip().upper() for part in text.split(",") if part.strip())
        if not names:
            raise argparse.ArgumentTypeError("give at least one strategy")
        return names

    @dataclass
    class Config:
        strategy: tuple = field(default=("FULL_SHARD",), metadata={"parse": strategies})

    assert parse_config(Config, argv=["--strategy", "full_shard, no_shard"]).strategy == (
        "FULL_SHARD",
        "NO_SHARD",
    )
    assert parse_config(Config, argv=[]).strategy == ("FULL_SHARD",)
    with pytest.raises(SystemExit) as exit_info:
        parse_config(Config, argv=["--strategy", " , "])
    assert exit_info.value.code == 2


def test_a_variant_types_each_value_like_its_flag():
    """``--variants``: a list flag's value goes through the field's own parser (a type or its
    metadata "parse"), numbers and booleans are typed, text stays text; a bad value is one
    sentence naming the flag."""
    import argparse
    from dataclasses import dataclass, field

    from fsdp_course.config import describe, int_at_least, list_flag, with_variant

    class Wraps(tuple):
        def __new__(cls, text=()):
            if isinstance(text, str):
                if text not in ("none", "transformer"):
                    raise argparse.ArgumentTypeError(f"{text!r}: choose from none, transformer")
                text = (text,)
            return super().__new__(cls, text)

    @dataclass
    class Config:
        wrap: Wraps = Wraps(("none", "transformer"))
        parts: tuple = field(default=("a", "b"), metadata={"parse": list_flag("Parts", ("a", "b"))})
        model: str = field(default="gpt", metadata={"choices": ("gpt", "staged")})
        data: str | None = None
        steps: int = 3
        keep: int = field(default=2, metadata={"parse": int_at_least(1)})
        timeline: bool = False
        variants: tuple | None = None

    variant = with_variant(
        Config(),
        {
            "wrap": "transformer",
            "parts": "b",
            "model": "staged",
            "data": "x.txt",
            "steps": "5",
            "keep": "3",
            "timeline": "true",
        },
    )
    assert variant == Config(
        wrap=Wraps(("transformer",)),
        parts=("b",),
        model="staged",
        data="x.txt",
        steps=5,
        keep=3,
        timeline=True,
    )
    assert type(variant.wrap) is Wraps

    class Switches(tuple):
        def __str__(self):
            return ",".join("on" if value else "off" for value in self)

    @dataclass
    class Echoed:
        parts: tuple = ("a", "b")
        no_sync: Switches = Switches((True, False))

    assert describe(Echoed()) == "parts=a,b no_sync=on,off"  # each list flag as it is typed
    for changes, said in [
        ({"wrap": "blocks"}, "wrap=blocks: 'blocks': choose from none, transformer"),
        ({"parts": "c"}, "parts=c: 'c': choose from a, b"),
        ({"steps": "many"}, "steps=many: not a number"),
        ({"keep": "0"}, "keep=0: must be at least 1, got 0"),  # its own parser
        ({"model": "llama"}, "model=llama: choose from gpt, staged"),
        ({"variants": "x"}, "no flag --variants in a variant"),
    ]:
        with pytest.raises(ValueError, match=re.escape(said)):
            with_variant(Config(), changes)


def test_one_list_flag_type_reads_a_list_once():
    """list_flag: every lesson's list flags are one kind of value, read where the config is read:
    items folded, parsed, checked, kept in order; printed as typed; a bad item is one line naming
    it; values already read (a default, dataclasses.asdict's copy) pass through untouched."""
    import argparse
    import dataclasses
    from dataclasses import dataclass, field

    from fsdp_course.config import describe, int_at_least, list_flag, parse_config

    Names = list_flag("Names", ("full", "grad-op"), fold=str.lower)
    Counts = list_flag("Counts", item=int_at_least(1), expected="whole numbers of 1 or more")
    Sizes = list_flag("Sizes", item=int_at_least(2))  # no expected: the item's own message
    Switches = list_flag(
        "Switches",
        item=lambda w: {"on": True, "off": False}[w],
        expected="on, off",
        show=lambda v: "on" if v else "off",
    )
    assert (
        Names(" FULL,grad-op ") == ("full", "grad-op")
        and str(Names("grad-op,full")) == "grad-op,full"
    )
    assert (
        Counts("4, 1") == (4, 1)
        and Switches("off,on") == (False, True)
        and str(Switches("on")) == "on"
    )
    for kind, text, said in (
        (Names, "full,zero", "'zero': choose from full, grad-op"),
        (Names, " , ", "' , ': choose from"),
        (Counts, "0", "'0': whole numbers"),
        (Counts, "x", "'x': whole numbers"),
        (Switches, "yes", "'yes': on, off"),
        (Sizes, "1", "must be at least 2, got 1"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(said)):
            kind(text)

    @dataclass
    class Config:
        names: Names = field(default=Names(("full",)), metadata={"parse": Names})
        switches: Switches = field(default=Switches((True, False)), metadata={"parse": Switches})

    cfg = parse_config(Config, argv=["--names", "grad-op,full"])
    assert type(cfg.names) is Names and cfg.names == ("grad-op", "full")
    assert describe(cfg) == "names=grad-op,full switches=on,off"
    copy = dataclasses.asdict(cfg)  # a tuple type rebuilt from its items, not re-read from text
    assert copy == {"names": ("grad-op", "full"), "switches": (True, False)}


def test_plan_runs_labels_the_command_line_and_each_variant():
    from dataclasses import dataclass, field

    from fsdp_course.config import parse_config, parse_variants, plan_runs

    @dataclass
    class Config:
        steps: int = 3
        mixed: bool = False
        data: str | None = None
        variants: tuple | None = field(default=None, metadata={"parse": parse_variants})
        metrics: str | None = None

    cfg = parse_config(Config, argv=["--variants", "mixed=true;steps=5,data=x.txt"])
    plan = plan_runs(cfg)
    assert [label for _, label in plan] == [None, "(mixed=true)", "(steps=5,data=x.txt)"]
    assert plan[0][0] is cfg and (plan[1][0].mixed, plan[2][0].steps, plan[2][0].data) == (
        True,
        5,
        "x.txt",
    )
    assert all(config.variants is None for config, _ in plan[1:])
    assert [c.steps for c, _ in plan_runs(cfg, with_base=False)] == [3, 5]  # the variants only
    # no variants: the command line
    assert plan_runs(Config(), with_base=False) == [(Config(), None)]
    assert plan_runs(parse_config(Config, argv=["--variants", "data=none"]))[1][0].data is None
    for text, said in (
        ("warp=1", "--variants: no flag --warp"),
        ("data=x.txt", "--variants: no flag --data in a variant"),
        ("mixed=maybe", "mixed=maybe: write true or false"),
    ):
        with pytest.raises(course_dist.CourseError, match=re.escape(said)):
            plan_runs(
                parse_config(Config, argv=["--variants", text]),
                fixed=("variants", "metrics", "data"),
            )


def test_metric_logger_prints_a_dash_for_what_a_step_did_not_measure(capsys):
    from fsdp_course.report import MetricLogger

    env = course_dist.DistEnv(
        rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), backend="gloo"
    )
    logger = MetricLogger(env, log_every=10)
    logger.log(0, 3.25, 41.0, 9.5, 1.25)
    logger.log(1, 3.20, 40.0, None, None)  # not a log step, not forced: no line
    logger.log(2, 3.10, 39.0, 9.5, 1.25, last=True)
    logger.log(3, 3.00, 38.0, None, None, last=True)
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and lines[0].split()[0] == "step"
    assert lines[1].split("|")[3].strip() == "9.50" and lines[3].split("|")[3].strip() == "-"
    assert lines[3].split("|")[4].strip() == "-" and "0.000" not in lines[3]
    assert [row["peak_mib"] for row in logger.history] == [9.5, None, 9.5, None]


def test_prune_keeps_the_newest_and_refuses_to_keep_none(tmp_path):
    from fsdp_course import checkpoint as ckpt

    for step in (2, 4, 6):
        (tmp_path / f"step_{step:06d}").mkdir()
        (tmp_path / f"step_{step:06d}" / ".metadata").write_bytes(b"x")
    found = [p.name for p in ckpt.published(tmp_path)]
    assert len(found) == 3
    ckpt.prune(tmp_path, 2)
    assert [p.name for p in ckpt.published(tmp_path)] == found[1:]
    with pytest.raises(ValueError, match="at least 1"):
        ckpt.prune(tmp_path, 0)
    assert [p.name for p in ckpt.published(tmp_path)] == found[1:]


def test_a_launch_log_shows_its_command_as_a_shell_reads_it(capsys):
    """The notebook's folded log starts with the command a learner can paste into a terminal:
    a --variants value holds ";", so it is quoted."""
    import shlex

    from course_lab.notebook import LessonRun, show_log

    command = ["bash", "launch/lesson2.sh", "--variants", "wrap=none;model=staged,wrap=none"]
    show_log(
        LessonRun(
            command=command, returncode=0, stdout="step 0\n", stderr="", metrics=None, nproc="2"
        )
    )
    summary = capsys.readouterr().out.splitlines()[0]
    assert summary.startswith("$ NPROC=2 bash launch/lesson2.sh --variants ")
    pasted = summary[2 : summary.index("   (exit 0")]
    assert shlex.split(pasted) == ["NPROC=2", *command]


def test_learner_code_is_loaded_one_way_with_one_line_errors(tmp_path):
    """Issue 23 item 1: every lesson script loads a learner's file with fsdp_course.learner:
    a missing file, a file that raises while it runs and a missing function are each one line
    (a CourseError: the script exits 2), naming the flag and the function it needs."""
    from fsdp_course.learner import load_learner

    wanted = "evaluate(model, batch, env)"
    with pytest.raises(CourseError) as missing:
        load_learner(tmp_path / "none.py", "--eval-module", wanted)
    assert str(missing.value) == f"--eval-module {tmp_path / 'none.py'}: no such file"
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\nraise ValueError('first line\\nsecond line')\n")
    with pytest.raises(CourseError) as raised:
        load_learner(broken, "--eval-module", wanted)
    assert str(raised.value) == f"--eval-module {broken}: ValueError: first line"
    typo = tmp_path / "typo.py"
    typo.write_text("def evaluate(model, batch, env)\n    return 0.0\n")
    with pytest.raises(CourseError, match=r"typo.py: SyntaxError: "):
        load_learner(typo, "--eval-module", wanted)
    other = tmp_path / "other.py"
    other.write_text("def evaluat(model, batch, env):\n    return 0.0\n")
    with pytest.raises(CourseError) as absent:
        load_learner(
            other, "--ckpt-module", "save(path, model, optimizer)", "load(path, model, optimizer)"
        )
    assert (
        str(absent.value)
        == f"--ckpt-module {other}: defines no function save(path, model, optimizer)"
    )
    good = tmp_path / "good.py"
    good.write_text(
        "from dataclasses import dataclass\n\n@dataclass\nclass Box:\n    x: int = 1\n\n"
        "def save(path, model, optimizer):\n    return Box().x\n\nload = save\n"
    )
    module = load_learner(
        good, "--ckpt-module", "save(path, model, optimizer)", "load(path, model, optimizer)"
    )
    assert module.save(None, None, None) == module.load(None, None, None) == 1


def test_a_cell_becomes_a_file_named_by_its_content(tmp_path, monkeypatch):
    """course_lab.learner: the lab side. A cell's whole text (imports included) with the name the
    script looks up bound at the end, saved under a name made from its content (the same cell
    is the same file, so the same launch); the starter cell is told apart by its
    NotImplementedError."""
    from course_lab import learner
    from fsdp_course.learner import load_learner

    monkeypatch.setattr(learner, "FOLDER", tmp_path)
    cell = tmp_path / "cell.py"
    cell.write_text(
        "import math\n\n\ndef my_eval(model, batch, env):\n    return math.pi\n\n\n"
        "def starter(model, batch, env):\n    raise NotImplementedError\n"
    )
    namespace = {}
    exec(compile(cell.read_text(), str(cell), "exec"), namespace)
    my_eval, starter = namespace["my_eval"], namespace["starter"]
    assert learner.cell_source(my_eval) == cell.read_text()
    assert learner.cell_source(my_eval, "evaluate").endswith("\n\nevaluate = my_eval\n")
    assert learner.untouched(starter, 3) and not learner.untouched(my_eval, 3)
    path = learner.save_cell(my_eval, "evaluate")
    assert path.parent == tmp_path and path.name.startswith("evaluate_")
    assert learner.save_cell(my_eval, "evaluate") == path  # the same cell: the same file
    assert learner.learner_file("x = 1\n", "evaluate") != path
    evaluate = load_learner(path, "--eval-module", "evaluate(model, batch, env)").evaluate
    assert evaluate(None, None, None) == pytest.approx(3.14159265)
