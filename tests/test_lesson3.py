"""Lesson 3 (no_sync and gradient accumulation) under torchrun on CPU ranks: the accumulated
gradient equals one big batch computed by a single process; no_sync reduce-scatters once per
step instead of K times; its memory cost (the unsharded gradient held between micro-batches) is
measured per rank; the no-sync-last bug is caught in both APIs; the lesson's loop is measured
wrong when the last micro-batch is short, and the exercise's solution right, for real.

The main launch is the notebook's one, declared once in lessons/03_no_sync/launches.toml
("sweep"): within a test run it runs once and is shared (tests/run_cache.py); so is the
exercise's check. Only the 3-rank run and one bad flag (on 1 rank) are the tests' own.
The instruments watch step 0 (the step ms/step leaves out); later steps are timed unwatched.
"""

from __future__ import annotations

import runpy
from contextlib import nullcontext
from pathlib import Path

import pytest

from course_lab.exercises import lesson3 as ex3
from course_lab.launches import declared
from fsdp_course import theory
from helpers import lesson_script
from lesson_runs import launch, ok

REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "solutions" / "lesson3_accumulate.py"
SWEEP = declared(3, "sweep")  # the notebook's one launch


def short_last(run):
    return len(set(run["micro_batch_sizes"])) > 1


def runs_by(data):
    """The runs with equal micro-batches, by (api, K, no_sync, bug)."""
    return {
        (r["api"], r["accum"], r["no_sync"], r["bug"]): r
        for r in data["results"]["runs"]
        if not short_last(r)
    }


def launched(*args, nproc=2):
    proc, data = launch(3, *args, nproc=nproc)
    ok(proc)
    return proc, data


@pytest.fixture(scope="module")
def notebook_launch():
    return launched(SWEEP.name, nproc=None)


# --- theory and the exercise's in-process stage (no torchrun) ---------------------------------


def test_theory_matches_the_quiz_numbers():
    saved = theory.accumulation.reduce_bytes_saved(1_000_000_000, accum=8, world_size=4)
    assert saved["payload"] == 28e9 and saved["sent_per_rank"] == 21e9
    P = 1_000_000_000
    extra = theory.accumulation.held_grad_bytes_theory(
        P, P, 8, no_sync=True
    ) - theory.accumulation.held_grad_bytes_theory(P, P, 8, no_sync=False)
    assert extra == 3.5e9
    assert theory.accumulation.fsdp1_padded_numel([5, 8], 4) == 8 + 8
    assert theory.accumulation.reduce_bytes_per_step(100, accum=4, no_sync=False) == 1600
    assert theory.accumulation.reduce_bytes_per_step(100, accum=4, no_sync=False, world_size=1) == 0


def _all_no_sync(model, micro_batches, loss_fn):
    for x, y in micro_batches:
        with model.no_sync():
            (loss_fn(model(x), y) / len(micro_batches)).backward()


def _sync_every(model, micro_batches, loss_fn):
    for x, y in micro_batches:
        (loss_fn(model(x), y) / len(micro_batches)).backward()


def _lesson_loop(model, micro_batches, loss_fn):  # right for equal micro-batches only
    for i, (x, y) in enumerate(micro_batches):
        with model.no_sync() if i < len(micro_batches) - 1 else nullcontext():
            (loss_fn(model(x), y) / len(micro_batches)).backward()


def _no_division(model, micro_batches, loss_fn):
    for i, (x, y) in enumerate(micro_batches):
        with model.no_sync() if i < len(micro_batches) - 1 else nullcontext():
            loss_fn(model(x), y).backward()


@pytest.mark.parametrize(
    "loop, words",
    [
        (_all_no_sync, "last micro-batch"),
        (_sync_every, "no backward ran inside"),
        (_lesson_loop, "equal micro-batches would give"),
        (_no_division, "differs from the one of a single batch"),
    ],
)
def test_exercise_explains_wrong_loops_without_torchrun(loop, words):
    passed, message = ex3.check_accumulate(loop)
    assert not passed and words in message, message
    assert "len(x)" not in message and "total" not in message  # says what is wrong, not the fix


def test_exercise_untouched_is_not_attempted():
    def accumulate(model, micro_batches, loss_fn):
        raise NotImplementedError

    with pytest.raises(NotImplementedError):
        ex3.check_accumulate(accumulate)


# --- under torchrun ----------------------------------------------------------------------------


def test_both_apis_match_the_big_batch_and_no_sync_reduces_once(notebook_launch):
    """K = 4, both APIs, no_sync on and off: equal gradients on every rank in all four; one
    reduce-scatter per unit with no_sync (K per unit without); all-gathers unchanged; the
    gradient bytes held between micro-batches per rank; each run's log fits a screen."""
    proc, data = notebook_launch
    runs, n = runs_by(data), data["world_size"]
    k4 = sorted(key for key in runs if key[1] == 4)
    assert k4 == sorted(
        (api, 4, no_sync, bug)
        for api in ("fsdp1", "fsdp2")
        for no_sync, bug in ((True, "none"), (True, "no-sync-last"), (False, "none"))
    )
    # the rest is the sweep's other K: classic FSDP, no_sync on and off
    assert sorted(set(runs) - set(k4)) == sorted(
        ("fsdp1", k, no_sync, "none") for k in (1, 2, 8) for no_sync in (True, False)
    )
    for api in ("fsdp1", "fsdp2"):
        on, off = runs[(api, 4, True, "none")], runs[(api, 4, False, "none")]
        P, P_pad = on["num_params"], on["padded_numel"]
        for run in (on, off):
            assert run["grads_equal"], api
            for rank in run["ranks"]:
                assert (
                    rank["held"] == "sharded"
                    and rank["rel_err"] < 1e-5
                    and abs(rank["scale"] - 1) < 1e-5
                )
                assert rank["step_changed_params"]
        assert on["reduce_bytes"] == on["reduce_bytes_theory"] == 4 * P_pad
        assert off["reduce_bytes"] == off["reduce_bytes_theory"] == 4 * 4 * P_pad
        assert on["gather_bytes"] == off["gather_bytes"] > 0
        for rank in on["ranks"]:  # no_sync: the whole unsharded gradient on every rank
            assert rank["held_between"] == {"sharded": 0, "unsharded": 4 * P}, (api, rank)
        for rank in off["ranks"]:  # synced: the rank's shard only
            assert rank["held_between"]["unsharded"] == 0
            assert rank["held_between"]["sharded"] == pytest.approx(4 * P_pad / n, rel=0.01)
        assert on["held_theory"] == 4 * P and on["held_between_unsharded"] == on["held_theory"]
    fsdp1_on, fsdp1_off = runs[("fsdp1", 4, True, "none")], runs[("fsdp1", 4, False, "none")]
    assert fsdp1_on["collectives"]["reduce_scatter"]["calls"] == 5  # one per unit, last micro-batch
    assert fsdp1_off["collectives"]["reduce_scatter"]["calls"] == 4 * 5
    assert fsdp1_on["padded_numel"] != runs[("fsdp2", 4, True, "none")]["padded_numel"]
    blocks, summary = proc.stdout.split("\nper optimizer step")
    blocks = blocks.split("\n== ")[1:]
    assert len(blocks) == 14 and all(len(b.splitlines()) <= 15 for b in blocks)
    assert (
        len(summary.splitlines()) == 3 + 14
        and "| no-sync-last |" in summary
        and " 2+2+2+1 |" in summary
    )


def test_instruments_watch_step_0_and_ms_per_step_times_the_others(notebook_launch):
    """Issue 9: step 0 is measured (and left out of ms/step, as the first step always is); the
    later steps are timed with no instrument attached, their memory and traffic columns "-"."""
    proc, data = notebook_launch
    for run in data["results"]["runs"]:
        first, *later = run["history"]
        assert first["step"] == 0 and first["peak_mib"] > 0 and first["sent_mib"] > 0
        assert all(row["peak_mib"] is None and row["sent_mib"] is None for row in later)
        assert run["ms_per_step"] == (later[0]["ms"] if later else None)  # the fsdp1 bug stops at 0
    assert [
        cell.strip() for cell in proc.stdout.split("\n    1 |")[1].splitlines()[0].split("|")[2:]
    ] == ["-", "-"]


def test_sweep_bytes_and_memory_against_k(notebook_launch):
    _, data = notebook_launch
    runs = runs_by(data)
    for k in (1, 2, 4, 8):
        on, off = runs[("fsdp1", k, True, "none")], runs[("fsdp1", k, False, "none")]
        assert on["grads_equal"] and off["grads_equal"]
        one = runs[("fsdp1", 1, True, "none")]
        assert on["reduce_bytes"] == on["reduce_bytes_theory"] == one["reduce_bytes"]
        assert off["reduce_bytes"] == off["reduce_bytes_theory"] == k * on["reduce_bytes"]
        assert on["gather_bytes"] == off["gather_bytes"] == k * one["gather_bytes"]
        held_on = on["held_between_unsharded"] + on["held_between_sharded"]
        assert held_on == on["held_theory"] == (4 * on["num_params"] if k > 1 else 0)


def test_no_sync_last_bug_is_caught_and_explained(notebook_launch):
    """`--bug no-sync-last`: classic FSDP fails at optimizer.step() (caught, one line, explained)
    with a wrong unsharded gradient on every rank; FSDP2 is silent and never updates. The runs
    after the failed one go on in the same launch."""
    proc, data = notebook_launch
    out = proc.stdout
    assert "Traceback" not in out
    runs = runs_by(data)
    fsdp1, fsdp2 = (
        runs[("fsdp1", 4, True, "no-sync-last")],
        runs[("fsdp2", 4, True, "no-sync-last")],
    )

    assert "must match the size of tensor b" in fsdp1["step_error"]
    # the quiz cites these as measured in lesson 3 (q_no_sync_last): the root unit's flat
    # parameter, whole (b) and its shard on 2 ranks (a)
    assert "tensor a (7694)" in fsdp1["step_error"] and "tensor b (15387)" in fsdp1["step_error"]
    assert "must match the size of tensor b" in out and "no reduce-scatter ever ran" in out
    assert not fsdp1["grads_equal"] and fsdp1["reduce_bytes"] == 0
    assert len(fsdp1["history"]) == 1  # the run stops at the failed step
    for rank in fsdp1["ranks"]:  # every rank is hit: its own micro-batches only, not averaged
        assert rank["held"] == "unsharded" and not rank["equal"] and rank["rel_err"] > 1e-3
        assert rank["held_after"]["unsharded"] == 4 * fsdp1["num_params"]
    scales = [r["scale"] for r in fsdp1["ranks"]]
    assert len(set(scales)) == len(scales)  # a different wrong gradient on each rank

    assert fsdp2["step_error"] is None and not fsdp2["grads_equal"] and fsdp2["reduce_bytes"] == 0
    assert len(fsdp2["history"]) == 2
    for rank in fsdp2["ranks"]:
        assert rank["held"] == "none" and not rank["step_changed_params"]
        assert rank["held_after"] == {"sharded": 0, "unsharded": 4 * fsdp2["num_params"]}
    assert "changed nothing" in out


def test_loss_over_k_is_wrong_for_a_short_last_micro_batch(notebook_launch):
    """The lesson's loop on micro-batches of 2 + 2 + 2 + 1 sequences, in both APIs: synced right
    (one reduce-scatter per unit), and yet every rank's gradient is off — no error says so. Only
    the lesson's loop gets the short micro-batch (no_sync on, no bug): one pitfall at a time."""
    _, data = notebook_launch
    short = [r for r in data["results"]["runs"] if short_last(r)]
    assert sorted(r["api"] for r in short) == ["fsdp1", "fsdp2"]
    for run in short:
        assert run["micro_batch_sizes"] == [2, 2, 2, 1] and run["no_sync"] and run["bug"] == "none"
        assert run["reduce_bytes"] == run["reduce_bytes_theory"]
        # q_short_last_micro_batch cites this as measured in lesson 3: "off by several percent"
        assert not run["grads_equal"] and all(0.01 < r["rel_err"] < 0.1 for r in run["ranks"])


def test_exercise_solution_passes_under_torchrun():
    """The checker's launch of the solution: the same loop file (named by its content) and
    flags as the notebook's check cell, so the run is shared."""
    passed, message = ex3.check_accumulate(runpy.run_path(str(SOLUTION))["accumulate"])
    assert passed, message
    assert "one sync" in message and "4 + 4 + 4 + 1" in message


def test_three_ranks_padding_and_k1():
    _, data = launched("--accum", "1,3", "--steps", "1", "--batch-size", "2", nproc=3)
    runs = runs_by(data)
    k1, k3 = runs[("fsdp1", 1, True, "none")], runs[("fsdp1", 3, True, "none")]
    assert data["world_size"] == 3 and len(k3["ranks"]) == 3
    assert k1["grads_equal"] and k3["grads_equal"]
    assert k1["reduce_bytes"] == k3["reduce_bytes"] == 4 * k3["padded_numel"]
    assert k3["padded_numel"] % 3 == 0 and k3["padded_numel"] >= k3["num_params"]
    assert k1["held_between_unsharded"] == k1["held_between_sharded"] == 0  # nothing in between
    assert k3["held_between_unsharded"] == 4 * k3["num_params"]


def test_bad_flags_are_one_line():
    """Every rank refuses the combination alike, before training: one rank shows the line and
    the exit code (test_planned_runs_skip_combinations_that_show_nothing has more refusals)."""
    proc, _ = launch(3, "--accum", "4", "--bug", "no-sync-last", "--no-sync", "off", nproc=1)
    assert proc.returncode == 2
    assert "error: --bug no-sync-last is about no_sync" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_planned_runs_skip_combinations_that_show_nothing():
    from types import SimpleNamespace

    runs = lesson_script(3, "runs")
    Apis, Bugs, Counts, Sizes, Switches = (
        runs.Apis,
        runs.Bugs,
        runs.Counts,
        runs.Sizes,
        runs.Switches,
    )
    from fsdp_course.dist import CourseError

    def plan(no_sync, bug, last):
        return runs.combinations(
            SimpleNamespace(
                api=Apis("fsdp1"),
                no_sync=Switches(no_sync),
                accum=Counts("3"),
                bug=Bugs(bug),
                last_batch_size=Sizes(last),
                batch_size=2,
            )
        )

    assert plan("on,off", "none,no-sync-last", "0,1") == [
        ("fsdp1", (2, 2, 2), True, "none"),
        ("fsdp1", (2, 2, 1), True, "none"),
        ("fsdp1", (2, 2, 2), True, "no-sync-last"),
        ("fsdp1", (2, 2, 2), False, "none"),
    ]
    # 2 = --batch-size: not short
    assert plan("on", "none", "2") == [("fsdp1", (2, 2, 2), True, "none")]
    with pytest.raises(CourseError, match="short last micro-batch runs with --no-sync on"):
        plan("off", "none", "1")


def test_list_flags_parse_once_into_typed_values():
    runs = lesson_script(3, "runs")
    Apis, Bugs, Counts, Sizes, Switches = (
        runs.Apis,
        runs.Bugs,
        runs.Counts,
        runs.Sizes,
        runs.Switches,
    )
    assert Counts("1, 2,8") == (1, 2, 8) and str(Counts("1,2")) == "1,2"
    assert Switches("on,off") == (True, False) and str(Switches("off,on")) == "off,on"
    assert Apis("FSDP2,fsdp1") == ("fsdp2", "fsdp1")
    assert Bugs("none, no-sync-last") == ("none", "no-sync-last") and str(Bugs("none")) == "none"
    assert Sizes("0,1") == (0, 1)
    for kind, bad in (
        (Counts, "0"),
        (Counts, "4,x"),
        (Counts, ""),
        (Switches, "yes"),
        (Apis, "fsdp3"),
        (Bugs, "no-sync"),
        (Sizes, "-1"),
    ):
        with pytest.raises(Exception, match=kind.expected.split(",")[0]):
            kind(bad)


def test_variants_run_after_the_command_line_and_bad_ones_are_one_line(capsys):
    """The script's own parser and plan, in-process: each --variants entry is the command line
    with some flags set to one value (typed by the flag's parser), its runs after the command
    line's. A bad variant is refused before anything runs with one line (CourseError: exit 2 under
    torchrun, as test_bad_flags_are_one_line launches), naming the variant."""
    from fsdp_course.config import parse_config
    from fsdp_course.dist import CourseError

    train = lesson_script(3)

    cfg = parse_config(train.Config, argv=list(SWEEP.args))
    assert [str(v) for v in cfg.variants] == [
        "(api=fsdp2,accum=4,steps=2)",
        "(accum=4,steps=2,bug=no-sync-last)",
        "(api=fsdp2,accum=4,steps=2,bug=no-sync-last)",
        "(accum=4,steps=2,last-batch-size=1)",
        "(api=fsdp2,accum=4,steps=2,last-batch-size=1)",
    ]
    plan = train.planned_runs(cfg)
    sweep = [
        (1, "fsdp1", (2,) * k, no_sync, "none") for no_sync in (True, False) for k in (1, 2, 4, 8)
    ]
    assert [
        (c.steps, api, sizes, no_sync, bug) for c, api, sizes, no_sync, bug in plan
    ] == sweep + [
        (2, "fsdp2", (2, 2, 2, 2), True, "none"),
        (2, "fsdp2", (2, 2, 2, 2), False, "none"),
        (2, "fsdp1", (2, 2, 2, 2), True, "no-sync-last"),
        (2, "fsdp2", (2, 2, 2, 2), True, "no-sync-last"),
        (2, "fsdp1", (2, 2, 2, 1), True, "none"),
        (2, "fsdp2", (2, 2, 2, 1), True, "none"),
    ]
    # typed like the command line's flags; the list flags it leaves are inherited
    variant = plan[-1][0]
    assert (
        variant.api,
        variant.accum,
        variant.no_sync,
        variant.last_batch_size,
        variant.variants,
    ) == (("fsdp2",), (4,), (True, False), (1,), None)
    assert type(variant.accum) is type(cfg.accum) and variant.batch_size == 2

    for text, needle in (
        ("seed=1", "--variants: no flag --seed in a variant"),
        ("warp=1", "--variants: no flag --warp"),
        ("accum=0", "--variants: accum=0: '0': whole numbers of 1 or more"),
        ("api=fsdp2;no-sync=maybe", "--variants: no-sync=maybe: 'maybe': on, off"),
        ("steps=x", "--variants: steps=x: not a number"),
        (
            "bug=no-sync-last,no-sync=off",
            r"--variants \(bug=no-sync-last,no-sync=off\): --bug no-sync-last is about no_sync",
        ),
        (
            "no-sync=off,last-batch-size=1",
            r"--variants \(no-sync=off,last-batch-size=1\): --last-batch-size: a short last",
        ),
        ("api=fsdp2", r"--variants \(api=fsdp2\): --loop-file: the exercise"),
    ):
        argv = ["--variants", text] + (["--loop-file", "mine.py"] if text == "api=fsdp2" else [])
        with pytest.raises(CourseError, match=needle) as refused:
            train.planned_runs(parse_config(train.Config, argv=argv))
        assert "\n" not in str(refused.value)
    with pytest.raises(SystemExit) as refused:  # argparse's own one-line error
        parse_config(train.Config, argv=["--variants", "accum"])
    assert (
        refused.value.code == 2 and "write flag=value" in capsys.readouterr().err.splitlines()[-1]
    )
