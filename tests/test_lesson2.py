"""Lesson 2 under torchrun on CPU ranks: per wrap policy, the FSDP units are the ones the policy
replay predicts, the all-gather peak (forward and backward) and the collectives equal the theory
to the byte, no policy gathers the whole model and moves the fewest bytes; per prefetch setting,
the peaks equal the theory and the recorded timeline shows each setting's order; the exercise's
checker and policy file work.

The notebook makes one launch, with --variants for the prefetch settings and the exercise model,
declared once in lessons/02_wrap_policies/launches.toml ("policies"); the fixtures read their runs
from it, so within a test run it runs once and is shared (tests/run_cache.py). Only the 3-rank run
and one bad flag (on 1 rank) are the tests' own; bad variants are checked in-process, through the
script's own parser.
The instruments watch step 1; ms/step is the median of the later steps, which they do not watch.
"""

import argparse
import functools
import runpy
from pathlib import Path

import pytest
import torch.nn as nn
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

from course_lab.exercises.lesson2 import (
    check_wrap_policy,
    policy_file,
    policy_source,
    staged_lm_module,
)
from fsdp_course import theory, wrapping
from fsdp_course.model import Block
from helpers import lesson_script
from lesson_runs import launch, ok

REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "solutions" / "lesson2_wrap_policy.py"
STAGED = staged_lm_module()  # also puts lesson 2's folder on sys.path (staged_lm)
# What the declared launch runs: each policy, then each prefetch setting with a timeline.
WRAPS = ("none", "transformer", "size", "size:20000", "custom")
PREFETCHES = ("pre", "post", "none", "forward", "no-limit")


def runs_by(metrics, key):
    return {r[key]: r for r in metrics["results"]["runs"]}


@pytest.fixture(scope="module")
def lesson_runs():
    proc, m = launch(2, "policies")
    ok(proc)
    return m["results"]["runs"]


@pytest.fixture(scope="module")
def n2(lesson_runs):
    return {r["wrap"]: r for r in lesson_runs if r["variant"] is None}  # the --wrap runs


@pytest.fixture(scope="module")
def prefetch(lesson_runs):
    return {r["prefetch"]: r for r in lesson_runs if r["timeline"]}


@pytest.fixture(scope="module")
def n3():
    proc, m = launch(2, "--wrap", "none,transformer", "--steps", "3", nproc=3)
    ok(proc)
    return runs_by(m, "wrap")


@pytest.fixture(scope="module")
def staged(lesson_runs):
    return {r["wrap"]: r for r in lesson_runs if r["model"] == "staged"}


def test_one_launch_runs_the_policies_then_each_variant(lesson_runs):
    """Each run says which flags made it, so the notebook can pick its runs."""
    made = [
        (r["model"], r["wrap"], r["prefetch"], r["timeline"] is not None, r["variant"])
        for r in lesson_runs
    ]
    assert made == (
        [("gpt", wrap, "pre", False, None) for wrap in WRAPS]
        + [
            ("gpt", "transformer", p, True, f"(wrap=transformer,prefetch={p},timeline=true)")
            for p in PREFETCHES
        ]
        + [
            ("staged", wrap, "pre", False, f"(model=staged,wrap={wrap})")
            for wrap in ("none", "transformer")
        ]
    )


def assert_matches_theory(run, world_size):
    """Units as the replay planned them; peaks per phase and collectives equal the theory."""
    planned = [(u["unit"], u["numel"]) for u in run["units_theory"] if u["numel"]]
    assert sorted((u["unit"], u["numel"]) for u in run["units"]) == sorted(planned)
    assert sum(u["numel"] for u in run["units"]) == run["num_params"]
    assert run["gathered_forward"] == run["gathered_theory_by_phase"]["forward"]
    assert run["gathered_backward"] == run["gathered_theory_by_phase"]["backward"]
    assert run["gathered_peak"] == run["gathered_theory"]
    assert all(r["gathered"] == run["gathered_peak"] for r in run["per_rank"])
    assert len(run["per_rank"]) == world_size
    calls = {k: v["calls"] for k, v in run["collectives"].items()}
    sizes = {k: v["bytes"] for k, v in run["collectives"].items()}
    assert calls == theory.wrapping.collective_calls(run["unit_numels_theory"], world_size)
    assert sizes == theory.collective_bytes(run["unit_numels_theory"], world_size, "FULL_SHARD")


@pytest.mark.parametrize("wrap", WRAPS)
def test_units_peaks_and_collectives_equal_theory(n2, wrap):
    assert_matches_theory(n2[wrap], 2)
    assert n2[wrap]["gathered_theory_by_phase"] == theory.wrapping.gathered_peaks(
        n2[wrap]["unit_numels_theory"], 2
    )
    assert n2[wrap]["loss_last"] < n2[wrap]["loss_first"] - 0.3


def test_unit_counts(n2):
    assert {w: r["num_units"] for w, r in n2.items()} == {
        "none": 1,
        "transformer": 5,
        "size": 5,
        "size:20000": 13,
        "custom": 7,
    }
    assert [u["wraps"] for u in n2["transformer"]["units"][1:]] == ["Block"] * 4
    assert [u["wraps"] for u in n2["size"]["units"][1:]] == ["MLP"] * 4
    # the quiz cites these as measured in lesson 2 (q_all_gather_calls, q_tiny_units)
    assert n2["transformer"]["collectives"]["all_gather"]["calls"] == 9
    assert n2["size:20000"]["collectives"]["all_gather"]["calls"] == 25


def test_no_policy_gathers_the_whole_model(n2):
    none, per_block = n2["none"], n2["transformer"]
    whole = theory.wrapping.padded_bytes(none["num_params"], 2)
    # the root stays gathered from forward through backward: the whole model, both phases
    assert none["gathered_peak"] == none["gathered_forward"] == none["gathered_backward"] == whole
    assert none["gathered_peak"] > 1.9 * per_block["gathered_peak"]
    # per block: the root + two blocks (the one computing, the one prefetched) in backward
    root, block = (u["gathered_bytes"] for u in per_block["units"][:2])
    assert per_block["gathered_backward"] == root + 2 * block
    assert per_block["gathered_forward"] == root + block


def test_memory_against_traffic(n2):
    """Issue 10 item 5: the all-gather bytes per step run from 1.00 P (no policy: the root is
    gathered once and kept) towards 2.00 P (a root that holds almost nothing), and the peak falls
    the other way; the reduce-scatter is 1 P whatever the policy."""
    param_bytes = 4 * n2["none"]["num_params"]
    gathered = {w: r["collectives"]["all_gather"]["bytes"] / param_bytes for w, r in n2.items()}
    assert round(gathered["none"], 2) == 1.00 and round(gathered["custom"], 2) == 2.00
    assert all(1 <= x < 2 for x in gathered.values())
    assert gathered["none"] < gathered["size"] < gathered["transformer"] < gathered["custom"]
    # the quiz cites these as measured in lesson 2 (q_tiny_units, q_policy_traffic)
    assert (round(gathered["transformer"], 2), round(gathered["size:20000"], 2)) == (1.98, 1.90)
    assert n2["custom"]["units"][0]["numel"] == 3739
    assert (
        n2["none"]["gathered_peak"]
        > n2["size"]["gathered_peak"]
        > n2["transformer"]["gathered_peak"]
    )
    for r in n2.values():
        assert round(r["collectives"]["reduce_scatter"]["bytes"] / param_bytes, 3) == 1.0


def test_size_threshold_leaves_attention_in_the_root(n2):
    size, per_block = n2["size"], n2["transformer"]
    assert size["units"][0]["numel"] > size["units"][1]["numel"]  # the root outweighs an MLP
    assert size["gathered_peak"] > per_block["gathered_peak"]
    fine = n2["size:20000"]
    assert fine["gathered_peak"] < per_block["gathered_peak"]
    assert (
        fine["collectives"]["all_gather"]["calls"] > per_block["collectives"]["all_gather"]["calls"]
    )


def test_policies_train_the_same_model(n2):
    losses = [r["loss_last"] for r in n2.values()]
    assert max(losses) - min(losses) < 1e-3


@pytest.mark.parametrize("wrap", ["none", "transformer"])
def test_three_ranks_pad_and_match_theory(n3, wrap):
    assert_matches_theory(n3[wrap], 3)
    assert all(
        u["gathered_bytes"] == theory.wrapping.padded_bytes(u["numel"], 3)
        for u in n3[wrap]["units"]
    )
    assert n3["none"]["gathered_peak"] > n3["transformer"]["gathered_peak"]


# --- prefetch settings and the timeline --------------------------------------------------------


def test_prefetch_peaks_equal_theory_and_bytes_do_not_move(prefetch):
    blocks = {}
    for name, run in prefetch.items():
        assert_matches_theory(run, 2)
        root, block = (u["gathered_bytes"] for u in run["units"][:2])
        blocks[name] = (
            (run["gathered_forward"] - root) // block,
            (run["gathered_backward"] - root) // block,
        )
    assert blocks == {
        "pre": (1, 2),
        "post": (1, 1),
        "none": (1, 1),
        "forward": (2, 3),
        "no-limit": (1, 2),
    }
    assert len({r["collectives"]["all_gather"]["bytes"] for r in prefetch.values()}) == 1


def test_timeline_records_every_unit_and_its_peak(prefetch):
    held_peak = lesson_script(
        2, "timeline"
    ).held_peak  # this lesson's module, as train.py imports it
    for name, run in prefetch.items():
        assert len(run["timeline"]) == 2, name  # one per rank
        for rank, events in enumerate(run["timeline"]):
            assert held_peak(events) == run["per_rank"][rank]["gathered"], (name, rank)
            for unit in (u["unit"] for u in run["units"]):
                mine = [e["what"] for e in events if e["unit"] == unit]
                gathers = 1 if unit == "(root)" else 2  # the root stays gathered for the step
                assert mine.count("held") == mine.count("all_gather") == gathers, (name, unit, mine)
                assert (
                    mine.count("reduce_scatter") == 1 and "forward" in mine and "backward" in mine
                )
            assert all(e["unit"] != "?" and e["end"] >= e["start"] for e in events)
            assert [e["what"] for e in events if e["unit"] == "(step)"] == [
                "forward",
                "backward",
                "optimizer",
            ]


def backward_of(events, unit):
    """The unit's backward events: its second held interval, its second all-gather, its RS."""
    held = [e for e in events if e["unit"] == unit and e["what"] == "held"][-1]
    gather = [e for e in events if e["unit"] == unit and e["what"] == "all_gather"][-1]
    rs = next(e for e in events if e["unit"] == unit and e["what"] == "reduce_scatter")
    return held, gather, rs


def test_timeline_shows_when_each_setting_gathers(prefetch):
    for rank in range(2):
        for i in range(3):  # block i is the one backward needs after block i+1
            this = {n: backward_of(prefetch[n]["timeline"][rank], f"blocks.{i}") for n in prefetch}
            after = {
                n: backward_of(prefetch[n]["timeline"][rank], f"blocks.{i + 1}") for n in prefetch
            }
            # pre: gathered while block i+1 is still held (computing); post: right after block
            # i+1 is freed, before its reduce-scatter; none: after that reduce-scatter
            assert this["pre"][0]["start"] < after["pre"][0]["end"]
            assert after["post"][0]["end"] <= this["post"][1]["start"] < after["post"][2]["start"]
            assert this["none"][1]["start"] > after["none"][2]["start"]
    order = {n: sequence(r["timeline"][0]) for n, r in prefetch.items()}
    assert order["no-limit"] == order["pre"]  # on CPU ranks the rate limiter never waits
    assert order["post"] != order["pre"] != order["none"] != order["post"]


def sequence(events):
    """Gathers, frees and reduce-scatters in the order they happened, without the times."""
    points = [
        (e["start"], e["unit"], "gathered" if e["what"] == "held" else e["what"])
        for e in events
        if e["what"] in ("held", "all_gather", "reduce_scatter")
    ]
    points += [(e["end"], e["unit"], "freed") for e in events if e["what"] == "held"]
    return [(unit, what) for _, unit, what in sorted(points)]


def test_prefetch_theory():
    units = [10, 4, 4, 4, 4]  # root and four equal blocks, numels, 2 ranks, 4 bytes each
    g = functools.partial(theory.wrapping.gathered_peaks, units, 2)
    assert g() == {"forward": 56, "backward": 72, "step": 72}
    assert (
        g(backward_prefetch="BACKWARD_POST")
        == g(backward_prefetch=None)
        == {"forward": 56, "backward": 56, "step": 56}
    )
    assert g(forward_prefetch=True) == {"forward": 72, "backward": 88, "step": 88}
    with pytest.raises(ValueError):
        g(backward_prefetch="EARLY")


# --- the exercise model and its checker ----------------------------------------------------------


def test_transformer_policy_on_the_exercise_model_wraps_nothing(staged):
    for wrap in ("none", "transformer"):
        assert_matches_theory(staged[wrap], 2)
    # the Block policy finds no Block in StagedLM: silently one unit, the same peak as no policy
    assert staged["transformer"]["num_units"] == 1
    assert staged["transformer"]["gathered_peak"] == staged["none"]["gathered_peak"]


def solution_policy():
    return runpy.run_path(str(SOLUTION))["policy"]


def test_solution_passes_the_launch_the_notebook_runs(staged):
    """The checker's launch of the solution: the same file (named by its content) and flags as
    the notebook's check cell, so the run is shared."""
    passed, message = check_wrap_policy(
        solution_policy(), none_peak=staged["none"]["gathered_peak"]
    )
    assert passed, message
    path = policy_file(policy_source(solution_policy()))
    proc, m = launch(
        2, "--model", "staged", "--wrap", "custom", "--policy-file", path, "--steps", "2", nproc=2
    )
    custom = m["results"]["runs"][0]
    assert_matches_theory(custom, 2)
    assert [u["wraps"] for u in custom["units"]] == (
        ["StagedLM", "Embedding"] + ["DecoderLayer"] * 4 + ["Linear"]
    )
    assert custom["gathered_peak"] < 0.4 * staged["none"]["gathered_peak"]


def test_bad_flag_is_one_line():
    """argparse refuses the flag before any rank joins the group, on every rank alike: one rank
    shows the line and the exit code (test_flags_parse_once_into_typed_values has the others)."""
    proc, metrics = launch(2, "--wrap", "blocks", "--steps", "1", nproc=1)
    assert proc.returncode == 2 and metrics is None
    assert "argument --wrap: 'blocks': choose from none, transformer, size, custom" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


def test_flags_parse_once_into_typed_values():
    runs = lesson_script(2, "runs")
    Prefetches, Wraps, load_policy = runs.Prefetches, runs.Wraps, runs.load_policy
    from fsdp_course.dist import CourseError

    assert (
        Wraps(" None, size:20000 ") == ("none", "size:20000")
        and str(Wraps("none,size")) == "none,size"
    )
    for bad in ("size:abc", "transformer:3", "", "pre"):
        with pytest.raises(Exception, match="choose from"):
            Wraps(bad)
    assert Prefetches("pre,no-limit") == ("pre", "no-limit")
    with pytest.raises(CourseError, match="add custom to --wrap"):
        load_policy("x.py", Wraps("size"))
    with pytest.raises(CourseError, match="no such file"):
        load_policy("/nonexistent/policy.py", Wraps("custom"))


def test_variants_parse_once_and_bad_ones_are_one_line():
    """The script's own parser and run plan, in-process: what a launch would refuse (one line,
    exit 2, through fsdp_course.dist.distributed) before anything runs."""
    train = lesson_script(2)
    from fsdp_course.config import parse_config, parse_variants
    from fsdp_course.dist import CourseError

    cfg = parse_config(
        train.Config,
        argv=[
            "--wrap",
            "none,size",
            "--variants",
            "wrap=transformer,prefetch=post,timeline=true; model=staged",
        ],
    )
    assert [str(v) for v in cfg.variants] == [
        "(wrap=transformer,prefetch=post,timeline=true)",
        "(model=staged)",
    ]
    plan = [
        (c.model, wrap, prefetch, c.timeline, variant)
        for c, wrap, prefetch, variant in train.runs.run_plan(cfg)
    ]
    assert plan == [
        ("gpt", "none", "pre", False, None),
        ("gpt", "size", "pre", False, None),
        ("gpt", "transformer", "post", True, "(wrap=transformer,prefetch=post,timeline=true)"),
        ("staged", "none", "pre", False, "(model=staged)"),  # the command line's --wrap
        ("staged", "size", "pre", False, "(model=staged)"),
    ]
    for text, needle in (
        ("warp=1", "no flag --warp"),
        ("wrap=blocks", "wrap=blocks: 'blocks': choose from"),
        ("prefetch=early", "prefetch=early: 'early': choose from"),
        ("timeline=yes", "true or false"),
        ("steps=two", "not a number"),
        ("model=llama", "model=llama: choose from gpt, staged"),
        ("policy-file=p.py", "no flag --policy-file in a variant"),
    ):
        with pytest.raises(CourseError, match=needle):
            train.runs.run_plan(parse_config(train.Config, argv=["--variants", text]))
    with pytest.raises(argparse.ArgumentTypeError, match="write flag=value"):
        parse_variants("timeline")


def test_checker_structure():
    passed, message = check_wrap_policy(solution_policy(), launch=False)
    assert passed, message

    block_policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
    passed, message = check_wrap_policy(block_policy, launch=False)
    assert not passed and "wraps nothing" in message

    def layers_only(module, recurse, nonwrapped_numel):
        return recurse or isinstance(module, STAGED.DecoderLayer)

    passed, message = check_wrap_policy(layers_only, launch=False)
    assert not passed and "embed" in message and "head" in message

    def too_fine(module, recurse, nonwrapped_numel):
        return recurse or isinstance(module, (STAGED.DecoderLayer, nn.Linear, nn.Embedding))

    passed, message = check_wrap_policy(too_fine, launch=False)
    assert not passed and "units inside units" in message

    def no_recurse(module, recurse, nonwrapped_numel):
        return isinstance(module, STAGED.DecoderLayer)

    passed, message = check_wrap_policy(no_recurse, launch=False)
    assert not passed and "recurse=True" in message

    def untouched(module, recurse, nonwrapped_numel):
        raise NotImplementedError

    with pytest.raises(NotImplementedError):
        check_wrap_policy(untouched, launch=False)


def test_policy_source_round_trip():
    policy = solution_policy()
    rebuilt = {}
    exec(compile(policy_source(policy), "policy.py", "exec"), rebuilt)
    model = STAGED.staged_lm()
    names = [name for name, _, _ in wrapping.policy_units(model, policy)]
    assert names == [name for name, _, _ in wrapping.policy_units(model, rebuilt["policy"])]
    assert policy_file(policy_source(policy)) == policy_file(policy_source(solution_policy()))
    with pytest.raises(ValueError):
        policy_source(lambda module, recurse, nonwrapped_numel: recurse)


def test_peak_theory():
    # root 10, blocks 4, 4, 4 (numels) on 2 ranks, 4 bytes each, no padding
    assert theory.wrapping.gathered_peaks([10, 4, 4, 4], 2) == {
        "forward": 56,
        "backward": 72,
        "step": 72,
    }
    assert theory.wrapping.gathered_peaks([10], 2)["step"] == 40  # no policy: the whole model
    assert theory.wrapping.gathered_peaks([3, 5], 2) == {
        "forward": 4 * (4 + 6),
        "backward": 40,
        "step": 40,
    }
    assert theory.wrapping.collective_calls([10, 4, 4, 4], 2) == {
        "all_gather": 7,
        "reduce_scatter": 4,
    }
    assert theory.wrapping.collective_calls([0, 4, 4], 2) == {"all_gather": 4, "reduce_scatter": 2}
    # one rank: classic FSDP runs NO_SHARD (torch's _init_utils.py), one all-reduce per unit
    assert theory.wrapping.collective_calls([10, 4, 4, 4], 1) == {"all_reduce": 4}
    assert theory.collective_bytes([10, 4, 4, 4], 1, "FULL_SHARD") == {"all_reduce": 4 * 22}


def test_instruments_watch_step_1_and_ms_per_step_times_the_others(n2, n3):
    """Issue 9: only step 1's line carries memory and traffic; the others read None ("-"). With
    a later step (the 3-rank run) ms/step is the unwatched median; with --steps 2 there is none,
    and the run says that its time is the watched step's."""
    for run in list(n2.values()) + list(n3.values()):
        assert run["watched_step"] == 1
        assert [row["peak_mib"] is not None for row in run["history"]] == [
            s == 1 for s in range(len(run["history"]))
        ]
        assert all((row["sent_mib"] is None) == (row["step"] != 1) for row in run["history"])
    for run in n2.values():  # --steps 2
        assert run["ms_per_step"] == run["history"][1]["ms"] and run["ms_timed"].startswith(
            "the watched step"
        )
    for run in n3.values():  # --steps 3: step 2 is timed unwatched
        assert (
            run["ms_per_step"] == run["history"][2]["ms"]
            and run["ms_timed"] == "median of 1 unwatched steps"
        )
