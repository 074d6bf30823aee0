"""Lesson 0 under torchrun on CPU ranks: what torchrun sets, the collective timeouts, DDP's full
replica and its all-reduce. The launches are the notebook's own, declared once in
lessons/00_torchrun_ddp/launches.toml, so within one test run the notebook's test and these
share them."""

import os
import sys

import pytest

from fsdp_course import theory
from helpers import run_cmd
from lesson_runs import launch, ok


def notebook_launch(name):
    proc, metrics = launch(0, name)
    ok(proc)
    return metrics


@pytest.fixture(scope="module")
def ddp2():
    return notebook_launch("two_ranks")


@pytest.fixture(scope="module")
def ddp1():
    return notebook_launch("one_rank")


def test_torchrun_env_seen_by_every_rank(ddp2):
    envs = ddp2["results"]["torchrun_env"]
    assert [int(e["RANK"]) for e in envs] == [0, 1]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert len({e["MASTER_PORT"] for e in envs}) == 1  # one rendezvous for all
    assert len({e["pid"] for e in envs}) == 2  # really two processes
    assert ddp2["world_size"] == 2 and ddp2["backend"] == "gloo"


def test_collective_timeouts_are_read_from_torch(ddp2):
    # The notebook states these: this job's own, gloo's default 30 min, NCCL's 10 min (torch 2.13).
    t = ddp2["results"]["timeouts"]
    assert t["this_job_s"] == float(os.environ.get("COURSE_TIMEOUT_S", "120"))
    assert t["gloo_default_s"] == 30 * 60
    assert t["nccl_default_s"] == 10 * 60
    assert "default_pg_timeout" in t["gloo_source"]
    assert "NCCL" in t["nccl_source"]


def test_ddp_holds_a_full_replica_whatever_the_world_size(ddp1, ddp2):
    for m in (ddp1, ddp2):
        r = m["results"]
        assert {
            k: r["bytes"][k] for k in ("params", "grads", "optimizer")
        } == theory.ddp_state_bytes(r["num_params"])
    # activations too: same batch per rank
    assert ddp1["results"]["bytes"] == ddp2["results"]["bytes"]


def test_ddp_all_reduces_every_gradient_once(ddp2):
    r = ddp2["results"]
    assert r["collectives"]["all_reduce"]["bytes"] == 4 * r["num_params"]


def test_ddp_buckets_are_a_second_copy_of_every_gradient(ddp2, ddp1):
    """Issue 22 item 17: DDP's buckets hold 4P beside the gradients (gradient_as_bucket_view
    is False by default: no gradient is a view into them), so a rank holds 16P + 4P."""
    for m in (ddp1, ddp2):  # whatever the world size
        b = m["results"]["ddp_buckets"]
        assert b["bytes"] == 4 * m["results"]["num_params"]
        assert b["grads"] > 0 and b["grads_inside"] == 0


def test_ddp_gradients_equal_single_process_and_loss_falls(ddp2):
    assert ddp2["results"]["grad_max_diff_vs_reference"] < 1e-6
    assert ddp2["results"]["loss_last"] < ddp2["results"]["loss_first"] - 0.3


def test_metrics_file_has_the_documented_keys(ddp2):
    for key in (
        "lesson",
        "world_size",
        "backend",
        "device",
        "torch_version",
        "config",
        "history",
        "results",
    ):
        assert key in ddp2
    assert ddp2["lesson"] == "lesson0" and ddp2["config"]["steps"] == 12
    assert [h["step"] for h in ddp2["history"]] == list(range(12))
    assert all({"step", "loss"} <= set(h) for h in ddp2["history"])


def test_plain_python_says_how_to_launch_and_exits_2():
    proc = run_cmd([sys.executable, "lessons/00_torchrun_ddp/train.py"])
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "torchrun" in lines[0] and "launch/lesson0.sh" in lines[0]


def test_bare_init_process_group_without_torchrun_names_the_missing_variable():
    # The notebook runs the same call to show what PyTorch itself says.
    proc = run_cmd(
        [sys.executable, "-c", "import torch.distributed as dist; dist.init_process_group('gloo')"],
        env={"RANK": None, "WORLD_SIZE": None, "MASTER_ADDR": None, "MASTER_PORT": None},
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "ValueError: Error initializing torch.distributed using env:// rendezvous: "
        "environment variable RANK expected, but not set"
    )


def test_trains_on_any_text_file(tmp_path):
    """Reading a text file is the same on every rank: one rank shows it (the 2-rank launches
    above show the ranks together)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("FSDP shards parameters, gradients and optimizer state. " * 200)
    proc, m = launch(0, "--data", corpus, "--steps", "6", nproc=1)
    ok(proc)
    assert m["config"]["data"] == str(corpus)
    assert m["results"]["loss_last"] < m["results"]["loss_first"]


def test_missing_data_file_is_one_line(tmp_path):
    """Every rank finds the file missing alike (rank 0 says it once: tests/test_library.py shows
    that on 2 ranks): one rank is enough to see the line and the exit code."""
    proc, _ = launch(0, "--data", tmp_path / "nope.txt", "--steps", "1", nproc=1)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "nope.txt" in errors[0] and "Traceback" not in proc.stderr
