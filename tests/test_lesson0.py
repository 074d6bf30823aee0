"""Lesson 0 under torchrun on CPU ranks: what torchrun sets, DDP's full replica, its all-reduce."""

import sys

import pytest

from helpers import run_cmd
from lesson_runs import launch, ok
from fsdp_course import theory


@pytest.fixture(scope="module")
def ddp2(tmp_path_factory):
    proc, metrics = launch(0, "--steps", "8", nproc=2, tmp=tmp_path_factory.mktemp("l0"))
    ok(proc)
    return proc, metrics


def test_torchrun_env_seen_by_every_rank(ddp2):
    _, m = ddp2
    envs = m["results"]["torchrun_env"]
    assert [int(e["RANK"]) for e in envs] == [0, 1]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert len({e["MASTER_PORT"] for e in envs}) == 1  # one rendezvous for all
    assert len({e["pid"] for e in envs}) == 2  # really two processes
    assert m["world_size"] == 2 and m["backend"] == "gloo"


def test_ddp_holds_a_full_replica_and_all_reduces_every_gradient(ddp2):
    _, m = ddp2
    r = m["results"]
    P = r["num_params"]
    assert {k: r["bytes"][k] for k in ("params", "grads", "optimizer")} == theory.ddp_state_bytes(P)
    assert r["collectives"]["all_reduce"]["bytes"] == 4 * P


def test_ddp_gradients_equal_single_process_and_loss_falls(ddp2):
    _, m = ddp2
    assert m["results"]["grad_max_diff_vs_reference"] < 1e-6
    assert m["results"]["loss_last"] < m["results"]["loss_first"] - 0.3


def test_metrics_file_has_the_documented_keys(ddp2):
    _, m = ddp2
    for key in ("lesson", "world_size", "backend", "device", "torch_version", "config", "history", "results"):
        assert key in m
    assert m["lesson"] == "lesson0" and m["config"]["steps"] == 8
    assert [h["step"] for h in m["history"]] == list(range(8))
    assert all({"step", "loss"} <= set(h) for h in m["history"])


def test_plain_python_says_how_to_launch_and_exits_2():
    proc = run_cmd([sys.executable, "lessons/00_torchrun_ddp/train.py"])
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "torchrun" in lines[0] and "launch/lesson0.sh" in lines[0]


def test_trains_on_any_text_file(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("FSDP shards parameters, gradients and optimizer state. " * 200)
    proc, m = launch(0, "--data", corpus, "--steps", "6", nproc=2, tmp=tmp_path)
    ok(proc)
    assert m["config"]["data"] == str(corpus)
    assert m["results"]["loss_last"] < m["results"]["loss_first"]


def test_missing_data_file_is_one_line(tmp_path):
    proc, _ = launch(0, "--data", tmp_path / "nope.txt", "--steps", "1", nproc=2, tmp=tmp_path)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "nope.txt" in errors[0] and "Traceback" not in proc.stderr
