"""Lesson 3 (no_sync and gradient accumulation) under torchrun on CPU ranks: the accumulated
gradient equals one big batch computed by a single process; no_sync reduce-scatters once per
step instead of K times; its memory cost (the unsharded gradient held between micro-batches) is
measured per rank; the no-sync-last bug is caught in both APIs; the exercise runs for real."""
from __future__ import annotations

import json
import sys

import pytest

from helpers import REPO_ROOT, run_cmd
from fsdp_course import theory
from course_lab.exercises import lesson3 as ex3

SCREEN_LINES = 40  # "one screen of output"


def launch(tmp_path, *args, nproc=2, name="metrics.json", timeout=400):
    metrics = tmp_path / name
    proc = run_cmd(["bash", REPO_ROOT / "launch" / "lesson3.sh", *args, "--metrics", metrics],
                   env={"NPROC": nproc, "PYTHON": sys.executable}, timeout=timeout)
    data = json.loads(metrics.read_text()) if metrics.is_file() else None
    return proc, data


def runs_by(data):
    return {(r["api"], r["accum"], r["no_sync"]): r for r in data["results"]["runs"]}


# --- theory and the exercise's in-process stage (no torchrun) ---------------------------------

def test_theory_matches_the_quiz_numbers():
    saved = theory.accumulation.reduce_bytes_saved(1_000_000_000, accum=8, world_size=4)
    assert saved["payload"] == 28e9 and saved["sent_per_rank"] == 21e9
    P = 1_000_000_000
    extra = (theory.accumulation.held_grad_bytes_theory(P, P, 8, no_sync=True)
             - theory.accumulation.held_grad_bytes_theory(P, P, 8, no_sync=False))
    assert extra == 3.5e9
    assert theory.accumulation.fsdp1_padded_numel([5, 8], 4) == 8 + 8
    assert theory.accumulation.reduce_bytes_per_step(100, accum=4, no_sync=False) == 1600


def _all_no_sync(model, micro_batches, loss_fn):
    for x, y in micro_batches:
        with model.no_sync():
            (loss_fn(model(x), y) / len(micro_batches)).backward()


def _no_division(model, micro_batches, loss_fn):
    from contextlib import nullcontext
    for i, (x, y) in enumerate(micro_batches):
        with model.no_sync() if i < len(micro_batches) - 1 else nullcontext():
            loss_fn(model(x), y).backward()


def _sync_every(model, micro_batches, loss_fn):
    for x, y in micro_batches:
        (loss_fn(model(x), y) / len(micro_batches)).backward()


@pytest.mark.parametrize("loop, words", [(_all_no_sync, "last micro-batch"),
                                         (_no_division, "divide"),
                                         (_sync_every, "no backward ran inside")])
def test_exercise_explains_wrong_loops_without_torchrun(loop, words):
    passed, message = ex3.check_accumulate(loop)
    assert not passed and words in message, message


def test_exercise_untouched_is_not_attempted():
    def accumulate(model, micro_batches, loss_fn):
        raise NotImplementedError
    with pytest.raises(NotImplementedError):
        ex3.check_accumulate(accumulate)


# --- under torchrun ----------------------------------------------------------------------------

@pytest.mark.slow
def test_accum_4_matches_big_batch_in_one_screen(tmp_path):
    """`bash launch/lesson3.sh --accum 4` as the course describes it."""
    proc, data = launch(tmp_path, "--accum", "4")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len((proc.stdout + proc.stderr).splitlines()) <= SCREEN_LINES
    run = data["results"]["runs"][0]
    assert run["api"] == "fsdp1" and run["grads_equal"]
    for rank in run["ranks"]:
        assert rank["held"] == "sharded" and rank["rel_err"] < 1e-5 and abs(rank["scale"] - 1) < 1e-5
        assert rank["step_changed_params"]
    assert run["reduce_bytes"] == run["reduce_bytes_theory"] == 4 * run["padded_numel"]
    assert run["collectives"]["reduce_scatter"]["calls"] == 5  # one per unit, last micro-batch only
    assert run["loss_last"] < run["loss_first"]
    assert "yes" in proc.stdout and "NO" not in proc.stdout


@pytest.mark.slow
def test_no_sync_last_bug_is_caught_and_explained(tmp_path):
    """`--bug no-sync-last`: classic FSDP fails at optimizer.step() (caught, one line, explained)
    with a wrong unsharded gradient on every rank; FSDP2 is silent and never updates."""
    proc, data = launch(tmp_path, "--accum", "4", "--bug", "no-sync-last", "--api", "fsdp1,fsdp2",
                        "--steps", "2", "--batch-size", "4")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-2000:]
    assert "Traceback" not in out
    fsdp1_part = out.split("== fsdp2")[0]
    assert len(fsdp1_part.splitlines()) <= SCREEN_LINES
    runs = runs_by(data)
    fsdp1, fsdp2 = runs[("fsdp1", 4, True)], runs[("fsdp2", 4, True)]

    assert "must match the size of tensor b" in fsdp1["step_error"]
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


@pytest.mark.slow
def test_no_sync_saves_reduce_bytes_and_costs_unsharded_gradients(tmp_path):
    """Both APIs, no_sync on and off, K = 4: equal gradients in all four; reduce-scatter 1x vs
    Kx per step; all-gathers unchanged; gradient bytes held between micro-batches per rank."""
    proc, data = launch(tmp_path, "--accum", "4", "--no-sync", "on,off", "--api", "fsdp1,fsdp2",
                        "--steps", "1", "--batch-size", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs, n = runs_by(data), data["world_size"]
    for api in ("fsdp1", "fsdp2"):
        on, off = runs[(api, 4, True)], runs[(api, 4, False)]
        P, P_pad = on["num_params"], on["padded_numel"]
        assert on["grads_equal"] and off["grads_equal"], api
        assert on["reduce_bytes"] == on["reduce_bytes_theory"] == 4 * P_pad
        assert off["reduce_bytes"] == off["reduce_bytes_theory"] == 4 * 4 * P_pad
        assert on["gather_bytes"] == off["gather_bytes"] > 0
        for rank in on["ranks"]:  # no_sync: the whole unsharded gradient on every rank
            assert rank["held_between"] == {"sharded": 0, "unsharded": 4 * P}, (api, rank)
        for rank in off["ranks"]:  # synced: the rank's shard only
            assert rank["held_between"]["unsharded"] == 0
            assert rank["held_between"]["sharded"] == pytest.approx(4 * P_pad / n, rel=0.01)
        assert on["held_theory"] == 4 * P and on["held_between_unsharded"] == on["held_theory"]
    assert runs[("fsdp1", 4, True)]["padded_numel"] != runs[("fsdp2", 4, True)]["padded_numel"]


@pytest.mark.slow
def test_three_ranks_padding_and_k1(tmp_path):
    proc, data = launch(tmp_path, "--accum", "1,3", "--steps", "1", "--batch-size", "2", nproc=3)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = runs_by(data)
    k1, k3 = runs[("fsdp1", 1, True)], runs[("fsdp1", 3, True)]
    assert data["world_size"] == 3 and len(k3["ranks"]) == 3
    assert k1["grads_equal"] and k3["grads_equal"]
    assert k1["reduce_bytes"] == k3["reduce_bytes"] == 4 * k3["padded_numel"]
    assert k3["padded_numel"] % 3 == 0 and k3["padded_numel"] >= k3["num_params"]
    assert k1["held_between_unsharded"] == k1["held_between_sharded"] == 0  # nothing in between
    assert k3["held_between_unsharded"] == 4 * k3["num_params"]


@pytest.mark.slow
def test_exercise_solution_passes_under_torchrun():
    sys.path.insert(0, str(REPO_ROOT / "solutions"))
    try:
        from lesson3_accumulate import accumulate
    finally:
        sys.path.pop(0)
    passed, message = ex3.check_accumulate(accumulate)
    assert passed, message
    assert "one sync" in message


@pytest.mark.slow
def test_loop_file_that_forgets_to_divide_is_measured_wrong(tmp_path):
    loop = tmp_path / "loop.py"
    loop.write_text("from contextlib import nullcontext\n\n"
                    "def accumulate(model, micro_batches, loss_fn):\n"
                    "    for i, (x, y) in enumerate(micro_batches):\n"
                    "        with model.no_sync() if i < len(micro_batches) - 1 else nullcontext():\n"
                    "            loss_fn(model(x), y).backward()\n")
    proc, data = launch(tmp_path, "--accum", "3", "--steps", "1", "--batch-size", "2",
                        "--loop-file", loop)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = data["results"]["runs"][0]
    assert not run["grads_equal"]
    assert all(abs(r["scale"] - 3) < 1e-4 for r in run["ranks"])  # K times the gradient
    assert run["reduce_bytes"] == run["reduce_bytes_theory"]  # its no_sync was right


@pytest.mark.slow
def test_bad_flags_are_one_line(tmp_path):
    proc, _ = launch(tmp_path, "--accum", "4", "--bug", "no-sync-last", "--no-sync", "off")
    assert proc.returncode == 2
    assert "error: --bug no-sync-last is about no_sync" in proc.stderr
    assert "Traceback" not in proc.stderr
