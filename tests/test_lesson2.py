"""Lesson 2 under torchrun on CPU ranks: per wrap policy, the FSDP units are the ones the policy
replay predicts, the all-gather peak (forward and backward) and the collectives equal the theory
to the byte, no policy gathers the whole model, and the exercise's checker and policy file work."""

import functools
import runpy
from pathlib import Path

import pytest
import torch.nn as nn
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

from lesson_runs import launch, ok
from fsdp_course import theory, wrapping
from course_lab.exercises.lesson2 import check_wrap_policy, policy_source
from fsdp_course.model import Block

REPO = Path(__file__).resolve().parents[1]
SOLUTION = REPO / "solutions" / "lesson2_wrap_policy.py"
WRAPS = "none,transformer,size,size:20000,custom"


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("l2")


def by_wrap(metrics):
    return {r["wrap"]: r for r in metrics["results"]["runs"]}


@pytest.fixture(scope="module")
def n2(tmp):
    proc, m = launch(2, "--wrap", WRAPS, "--steps", "6", nproc=2, tmp=tmp)
    ok(proc)
    return by_wrap(m)


@pytest.fixture(scope="module")
def n3(tmp):
    proc, m = launch(2, "--wrap", "none,transformer", "--steps", "2", nproc=3, tmp=tmp)
    ok(proc)
    return by_wrap(m)


@pytest.fixture(scope="module")
def staged(tmp):
    proc, m = launch(2, "--model", "staged", "--wrap", "none,transformer,custom",
                     "--policy-file", SOLUTION, "--steps", "2", nproc=2, tmp=tmp)
    ok(proc)
    return by_wrap(m)


def assert_matches_theory(run, world_size):
    """Units as the replay planned them; peaks per phase and collectives equal the theory."""
    planned = [(u["unit"], u["numel"]) for u in run["units_theory"] if u["numel"]]
    assert sorted((u["unit"], u["numel"]) for u in run["units"]) == sorted(planned)
    assert sum(u["numel"] for u in run["units"]) == run["num_params"]
    peaks = theory.wrapping.gathered_peaks(run["unit_numels_theory"], world_size)
    assert run["gathered_theory_by_phase"] == peaks
    assert run["gathered_forward"] == peaks["forward"]
    assert run["gathered_backward"] == peaks["backward"]
    assert run["gathered_peak"] == peaks["step"]
    assert all(r["gathered"] == run["gathered_peak"] for r in run["per_rank"])
    assert len(run["per_rank"]) == world_size
    calls = {k: v["calls"] for k, v in run["collectives"].items()}
    sizes = {k: v["bytes"] for k, v in run["collectives"].items()}
    assert calls == theory.wrapping.collective_calls(run["unit_numels_theory"], world_size)
    assert sizes == theory.collective_bytes(run["unit_numels_theory"], world_size, "FULL_SHARD")


@pytest.mark.parametrize("wrap", WRAPS.split(","))
def test_units_peaks_and_collectives_equal_theory(n2, wrap):
    assert_matches_theory(n2[wrap], 2)
    assert n2[wrap]["loss_last"] < n2[wrap]["loss_first"] - 0.3


def test_unit_counts(n2):
    assert {w: r["num_units"] for w, r in n2.items()} == {
        "none": 1, "transformer": 5, "size": 5, "size:20000": 13, "custom": 7}
    assert [u["wraps"] for u in n2["transformer"]["units"][1:]] == ["Block"] * 4
    assert [u["wraps"] for u in n2["size"]["units"][1:]] == ["MLP"] * 4


def test_no_policy_gathers_the_whole_model(n2):
    none, per_block = n2["none"], n2["transformer"]
    whole = theory.wrapping.padded_bytes(none["num_params"], 2)
    assert none["gathered_peak"] == none["gathered_forward"] == whole
    assert none["gathered_peak"] > 1.9 * per_block["gathered_peak"]
    # per block: the root + two blocks (the one computing, the one prefetched) in backward
    root, block = (u["gathered_bytes"] for u in per_block["units"][:2])
    assert per_block["gathered_backward"] == root + 2 * block
    assert per_block["gathered_forward"] == root + block


def test_size_threshold_leaves_attention_in_the_root(n2):
    size, per_block = n2["size"], n2["transformer"]
    assert size["units"][0]["numel"] > size["units"][1]["numel"]  # the root outweighs an MLP
    assert size["gathered_peak"] > per_block["gathered_peak"]
    fine = n2["size:20000"]
    assert fine["gathered_peak"] < per_block["gathered_peak"]
    assert fine["collectives"]["all_gather"]["calls"] > per_block["collectives"]["all_gather"]["calls"]


def test_policies_train_the_same_model(n2):
    losses = [r["loss_last"] for r in n2.values()]
    assert max(losses) - min(losses) < 1e-3


@pytest.mark.parametrize("wrap", ["none", "transformer"])
def test_three_ranks_pad_and_match_theory(n3, wrap):
    assert_matches_theory(n3[wrap], 3)
    assert all(u["gathered_bytes"] == theory.wrapping.padded_bytes(u["numel"], 3) for u in n3[wrap]["units"])
    assert n3["none"]["gathered_peak"] > n3["transformer"]["gathered_peak"]


def test_exercise_model_and_solution_policy_file(staged):
    for wrap in ("none", "transformer", "custom"):
        assert_matches_theory(staged[wrap], 2)
    # the Block policy finds no Block in StagedLM: silently one unit, the same peak as no policy
    assert staged["transformer"]["num_units"] == 1
    assert staged["transformer"]["gathered_peak"] == staged["none"]["gathered_peak"]
    custom = staged["custom"]
    assert [u["wraps"] for u in custom["units"]] == (
        ["StagedLM", "Embedding"] + ["DecoderLayer"] * 4 + ["Linear"])
    assert custom["gathered_peak"] < 0.4 * staged["none"]["gathered_peak"]


@pytest.mark.parametrize("args,message", [
    (("--wrap", "blocks"), "--wrap 'blocks': choose from none, transformer, size, custom"),
    (("--wrap", "size", "--policy-file", "x.py"), "--policy-file is used by --wrap custom"),
])
def test_bad_flags_are_one_line(tmp, args, message):
    proc, metrics = launch(2, *args, "--steps", "1", nproc=2, tmp=tmp)
    assert proc.returncode != 0 and metrics is None
    assert message in proc.stderr and "Traceback" not in proc.stderr


# --- the exercise's checker, without launching -----------------------------------------------

def solution_policy():
    return runpy.run_path(str(SOLUTION))["policy"]


def test_checker_structure():
    passed, message = check_wrap_policy(solution_policy(), launch=False)
    assert passed, message

    block_policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
    passed, message = check_wrap_policy(block_policy, launch=False)
    assert not passed and "wraps nothing" in message

    def layers_only(module, recurse, nonwrapped_numel):
        return recurse or isinstance(module, wrapping.DecoderLayer)
    passed, message = check_wrap_policy(layers_only, launch=False)
    assert not passed and "embed" in message and "head" in message

    def too_fine(module, recurse, nonwrapped_numel):
        return recurse or isinstance(module, (wrapping.DecoderLayer, nn.Linear, nn.Embedding))
    passed, message = check_wrap_policy(too_fine, launch=False)
    assert not passed and "units inside units" in message

    def no_recurse(module, recurse, nonwrapped_numel):
        return isinstance(module, wrapping.DecoderLayer)
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
    model = wrapping.staged_lm()
    names = [name for name, _, _ in wrapping.policy_units(model, policy)]
    assert names == [name for name, _, _ in wrapping.policy_units(model, rebuilt["policy"])]
    with pytest.raises(ValueError):
        policy_source(lambda module, recurse, nonwrapped_numel: recurse)


def test_peak_theory():
    # root 10, blocks 4, 4, 4 (numels) on 2 ranks, 4 bytes each, no padding
    assert theory.wrapping.gathered_peaks([10, 4, 4, 4], 2) == {"forward": 56, "backward": 72, "step": 72}
    assert theory.wrapping.gathered_peaks([10], 2)["step"] == 40  # no policy: the whole model
    assert theory.wrapping.gathered_peaks([3, 5], 2) == {"forward": 4 * (4 + 6), "backward": 40, "step": 40}
    assert theory.wrapping.collective_calls([10, 4, 4, 4], 2) == {"all_gather": 7, "reduce_scatter": 4}
    assert theory.wrapping.collective_calls([0, 4, 4], 2) == {"all_gather": 4, "reduce_scatter": 2}
