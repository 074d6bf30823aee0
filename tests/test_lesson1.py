"""Lesson 1 under torchrun on CPU ranks: every strategy's bytes per rank and bytes per
collective equal the theory to the byte; model state falls as 1/N; losses agree across strategies."""

import pytest

from lesson_runs import launch, ok
from fsdp_course import theory

STATE = ("params", "grads", "optimizer")


@pytest.fixture(scope="module")
def tmp(tmp_path_factory):
    return tmp_path_factory.mktemp("l1")


@pytest.fixture(scope="module")
def n2(tmp):
    proc, m = launch(1, "--strategy", "FULL_SHARD,SHARD_GRAD_OP,NO_SHARD", "--steps", "8", nproc=2, tmp=tmp)
    ok(proc)
    return {r["strategy"]: r for r in m["results"]["runs"]}


@pytest.fixture(scope="module")
def n4(tmp):
    proc, m = launch(1, "--strategy", "FULL_SHARD,HYBRID_SHARD", "--replicas", "2", "--steps", "3",
                     nproc=4, tmp=tmp)
    ok(proc)
    return {r["strategy"]: r for r in m["results"]["runs"]}


@pytest.fixture(scope="module")
def n1(tmp):
    proc, m = launch(1, "--steps", "3", nproc=1, tmp=tmp)
    ok(proc)
    return m["results"]["runs"][0]


@pytest.fixture(scope="module")
def n3(tmp):
    proc, m = launch(1, "--steps", "3", nproc=3, tmp=tmp)
    ok(proc)
    return m["results"]["runs"][0]


def state(run):
    return {k: run["bytes"][k] for k in STATE}


@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD"])
def test_bytes_per_rank_and_per_collective_equal_theory(n2, strategy):
    run = n2[strategy]
    units = run["unit_numels"]
    assert state(run) == theory.model_state_bytes(units, 2, strategy)
    assert run["bytes"]["gathered"] == theory.gathered_peak_bytes(units, 2, strategy)
    assert {k: v["bytes"] for k, v in run["collectives"].items()} == theory.collective_bytes(units, 2, strategy)
    assert run["loss_last"] < run["loss_first"] - 0.3


def test_full_shard_vs_shard_grad_op(n2):
    fs, sgo = n2["FULL_SHARD"], n2["SHARD_GRAD_OP"]
    P = 4 * fs["num_params"]
    assert state(fs) == state(sgo)  # same sharded state...
    assert sgo["bytes"]["gathered"] > 1.9 * fs["bytes"]["gathered"]  # ...SGO holds all params gathered
    assert 1.9 < fs["collectives"]["all_gather"]["bytes"] / P < 2.0  # FS gathers twice (minus root)
    assert 0.99 < sgo["collectives"]["all_gather"]["bytes"] / P < 1.01


def test_every_strategy_trains_the_same_model(n2):
    # FSDP does not shard activations: the same batch saves the same bytes for backward.
    assert len({r["bytes"]["activations"] for r in n2.values()}) == 1
    assert n2["FULL_SHARD"]["bytes"]["activations"] > 0
    losses = {s: [h["loss"] for h in r["history"]] for s, r in n2.items()}
    for s in ("SHARD_GRAD_OP", "NO_SHARD"):
        assert losses[s] == pytest.approx(losses["FULL_SHARD"], abs=1e-4)


def test_model_state_falls_as_one_over_n(n1, n2, n3, n4):
    one = sum(state(n1).values())
    P = n1["num_params"]
    assert one == 16 * P
    for n, run in ((2, n2["FULL_SHARD"]), (3, n3), (4, n4["FULL_SHARD"])):
        total = sum(state(run).values())
        assert total == sum(theory.model_state_bytes(run["unit_numels"], n, "FULL_SHARD").values())
        assert total / one == pytest.approx(1 / n, rel=1e-3)  # padding only: a few elements per unit


def test_uneven_shards_are_padded_on_three_ranks(n3):
    units = n3["unit_numels"]
    assert any(u % 3 for u in units), "the model should not divide evenly by 3"
    per_rank = n3["bytes_per_rank"]
    assert len(per_rank) == 3 and all(state(n3) == {k: r[k] for k in STATE} for r in per_rank)
    assert state(n3)["params"] == 4 * sum(-(-u // 3) for u in units)  # ceil: padding included


def test_hybrid_shard_shards_within_a_group_and_all_reduces_across(n4):
    run = n4["HYBRID_SHARD"]
    units = run["unit_numels"]
    assert state(run) == theory.model_state_bytes(units, 4, "HYBRID_SHARD", replicas=2)
    assert state(run) == theory.model_state_bytes(units, 2, "FULL_SHARD")  # shards over 2, not 4
    assert {k: v["bytes"] for k, v in run["collectives"].items()} == \
        theory.collective_bytes(units, 4, "HYBRID_SHARD", replicas=2)
    assert [h["loss"] for h in run["history"]] == pytest.approx(
        [h["loss"] for h in n4["FULL_SHARD"]["history"]], abs=1e-4)


def test_mixed_precision_halves_the_wire_not_the_state(tmp, n2):
    proc, m = launch(1, "--mixed-precision", "--steps", "3", nproc=2, tmp=tmp)
    ok(proc)
    bf16, fp32 = m["results"]["runs"][0], n2["FULL_SHARD"]
    assert state(bf16) == state(fp32)
    for kind in ("all_gather", "reduce_scatter"):
        assert bf16["collectives"][kind]["bytes"] * 2 == fp32["collectives"][kind]["bytes"]


@pytest.mark.parametrize("args, nproc, needle", [
    (("--strategy", "HYBRID_SHARD"), 2, "HYBRID_SHARD"),
    (("--strategy", "ZERO4"), 2, "--strategy ZERO4"),
])
def test_bad_strategy_input_is_one_line_and_exit_2(tmp, args, nproc, needle):
    proc, _ = launch(1, *args, "--steps", "1", nproc=nproc, tmp=tmp)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
