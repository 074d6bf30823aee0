"""Lesson 8 (troubleshooting and scale-out) under torchrun on CPU ranks: each failure reproduced
and diagnosed in bounded time, HSDP over two torchrun agents (bytes by link vs theory, a node
killed and resumed bitwise), the 2-D (data x tensor) mesh, accelerate's FSDP config, the
exercise. The launches the notebook makes are shared with it (``jobs.shared`` and the course's
launch cache): same names, flags and environment here as there.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys

import pytest

from helpers import REPO_ROOT, lesson_script, run_cmd

LESSON = REPO_ROOT / "lessons" / "08_troubleshooting"
sys.path.insert(0, str(LESSON))
import diagnosis  # noqa: E402
import ecosystem  # noqa: E402
import jobs  # noqa: E402
import knobs  # noqa: E402
from course_lab.exercises.lesson8 import check_fix_the_job  # noqa: E402
from fsdp_course.theory import hsdp  # noqa: E402

# --- the notebook's runs (same arguments as its cells) ---------------------------------------


def hang():
    return jobs.shared("hang", jobs.hang_and_dump, "--fault", "uneven-data", timeout_s=10)


def detail():
    return jobs.shared(
        "detail",
        jobs.run_and_diagnose,
        "--fault",
        "rank-branch",
        pattern="Detected mismatch",
        env={
            "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
            "GLOO_SOCKET_IFNAME": "lo",
            "COURSE_TIMEOUT_S": 60,
        },
    )


def crash():
    return jobs.shared(
        "crash",
        jobs.run_and_diagnose,
        "--fault",
        "oom",
        "--memory-limit-mib",
        "48",
        pattern="Root Cause",
        plain_torchrun=True,
    )


def two_nodes():
    return jobs.shared(
        "two_nodes", jobs.two_nodes, "--replicas", "2", "--compare-flat", "--steps", "1"
    )


# the notebook's opt-in cell (RUN_NODE_FAULT); one rank per node: a restart starts all again
def node_fault():
    return jobs.shared(
        "node_fault",
        jobs.two_nodes,
        "--replicas",
        "2",
        "--ckpt-every",
        "2",
        "--kill-node-at-step",
        "5",
        "--ckpt-dir",
        "runs/lesson8/node-fault",
        nproc=1,
        env={"MAX_RESTARTS": 1},
    )


# --- without launching ------------------------------------------------------------------------


def test_default_timeouts_read_from_torch():
    gloo, nccl = knobs.default_timeouts()
    assert gloo["seconds"] == 1800 and nccl["seconds"] == 600
    assert "10 * 60 * 1000" in nccl["source"]


def test_gpu_knobs_are_named_in_torch_source():
    rows = {
        r["variable"].split("=")[0].split(" ")[0]: r
        for r in knobs.gpu_knobs({"TORCH_DISTRIBUTED_DEBUG": True})
    }
    assert "ProcessGroupNCCL.hpp" in rows["TORCH_NCCL_ASYNC_ERROR_HANDLING"]["named in torch 2.13"]
    assert "FlightRecorder.hpp" in rows["TORCH_FR_BUFFER_SIZE"]["named in torch 2.13"]
    assert rows["TORCH_DISTRIBUTED_DEBUG"]["verified here"].startswith("yes")
    assert rows["NCCL_DEBUG"]["verified here"].startswith("no")


def test_nccl_error_handling_modes_read_from_the_header():
    handling = knobs.nccl_error_handling_modes()
    assert handling["default"] == 3 and handling["modes"][3]["name"] == "SkipCleanUp"
    assert handling["modes"][3] == {
        "name": "SkipCleanUp",
        "aborts the NCCL communicators": False,
        "tears the process down": True,
    }
    assert [m["name"] for _, m in sorted(handling["modes"].items())] == [
        "NoHandling",
        "TearDown",
        "CleanUpOnly",
        "SkipCleanUp",
    ]


def test_gloo_socket_ifname_picks_the_interface():
    bad, lo = knobs.gloo_interface_check(["no-such-nic0", "lo"])
    assert "Unable to find address for: no-such-nic0" in bad["result"], bad
    assert lo["result"].endswith("[3.0, 3.0]"), lo
    rows = {r["variable"]: r for r in knobs.gpu_knobs({"GLOO_SOCKET_IFNAME": True})}
    assert rows["GLOO_SOCKET_IFNAME"]["verified here"].startswith("yes")
    assert (
        "2000 entries"
        in rows["TORCH_FR_BUFFER_SIZE (TORCH_NCCL_TRACE_BUFFER_SIZE)"]["what it does"]
    )


def test_zero_plus_plus_names_exist_in_torch():
    found = ecosystem.fsdp_hooks_for_zero_extras()
    assert "world size to reshard to after forward" in found["reshard_after_forward int"]
    assert found["tensor-subclass hooks FSDP2 calls"] == [
        "fsdp_pre_all_gather",
        "fsdp_post_all_gather",
    ]
    assert found["FSDPModule setters"] == ["set_custom_all_gather", "set_custom_reduce_scatter"]
    assert found["built-in collectives"] and not any(
        "quant" in c.lower() or "8" in c for c in found["built-in collectives"]
    )
    hpz = next(b for a, b in ecosystem.ZERO_EXTRAS if "hpZ" in a)
    assert "reshard_after_forward=<int>" in hpz and "Not HSDP" in hpz


def test_accelerate_bf16_reduces_in_bf16():
    pytest.importorskip(
        "accelerate", reason="accelerate is in the course's requirements: bash launch/setup.sh"
    )
    import torch

    v2, v1 = (
        ecosystem.accelerate_mixed_precision(2, "bf16"),
        ecosystem.accelerate_mixed_precision(1, "bf16"),
    )
    assert (v2.param_dtype, v2.reduce_dtype, v2.output_dtype) == (torch.bfloat16,) * 3
    assert (v1.param_dtype, v1.reduce_dtype, v1.buffer_dtype) == (torch.bfloat16,) * 3
    row = next(v for k, v, _ in ecosystem.ACCELERATE_KEYS if k.startswith("mixed_precision"))
    assert "reduce_dtype=bf16" in row and "output_dtype=bf16" in row and "buffer_dtype=bf16" in row


def test_hsdp_and_tp_theory():
    shapes = [[[27, 64], [64, 64]], [[256, 64], [256]]]
    split = hsdp.hsdp_collective_bytes(shapes, replicas=2, shards=2)
    assert split["inter"] == {"all_reduce": 4 * (14 * 64 + 32 * 64 + 128 * 64 + 128)}
    flat = hsdp.flat_collective_bytes(shapes, nodes=2, ranks_per_node=2)
    assert flat["intra"] == {} and flat["inter"]["reduce_scatter"] > split["inter"]["all_reduce"]
    assert hsdp.tp_mlp_all_reduce_bytes(8, 64, 64, 2) == 524288
    assert hsdp.node_of_rank(3, 2) == 1


def test_accelerate_config_maps_to_fully_shard():
    pytest.importorskip(
        "accelerate", reason="accelerate is in the course's requirements: bash launch/setup.sh"
    )
    plugin = ecosystem.accelerate_plugin(LESSON / "accelerate_fsdp.yaml")
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
    assert ecosystem.wrap_targets(plugin) == ["Block"]
    assert ecosystem.fully_shard_kwargs(plugin) == {"reshard_after_forward": True}
    assert "SHARDED_STATE_DICT" in str(plugin.state_dict_type)


def test_zero_table_matches_the_quiz():
    from fsdp_course.theory import memory

    shape = memory.scaled_shape(1e9)
    rows = {r["DeepSpeed"]: r for r in ecosystem.zero_table(shape, 8, batch=1)}
    p = shape.num_params
    assert rows["ZeRO-0"]["ZeRO state/rank"] == 16 * p
    assert rows["ZeRO-2"]["ZeRO state/rank"] == int(2 * p + 14 * p / 8)  # the quiz: 3.75e9 at 1e9
    assert rows["ZeRO-3"]["ZeRO state/rank"] == int(16 * p / 8)
    assert rows["ZeRO-1"]["FSDP state/rank"] == ""  # no FSDP strategy shards the optimizer alone
    assert rows["ZeRO-3"]["FSDP state/rank"] < rows["ZeRO-0"]["FSDP state/rank"]
    assert memory.zero_stage_bytes(1e9, 8, 2)["total"] == 3.75e9


# --- failures, diagnosed ------------------------------------------------------------------------


@pytest.mark.slow
def test_hang_stacks_name_the_waiting_lines_and_the_timeout_ends_it():
    r = hang()
    assert r["returncode"] != 0
    waiting = r["waiting"]
    assert set(waiting) == {"0", "1"}
    assert "all_gather" in waiting["0"]["innermost"] and waiting["0"]["script_line"].startswith(
        "train train.py:"
    )
    assert "barrier" in waiting["1"]["innermost"] and waiting["1"]["script_line"].startswith(
        "run train.py:"
    )
    assert f"Timed out waiting {r['timeout_s'] * 1000}ms" in r["output"]
    # each rank that reports names its own collective; the first to exit makes torchrun stop the
    # other, which may then print nothing (seen in a fresh clone: only rank 1's lines), so one
    # report is what every run has
    reported = {
        rank: re.search(rf"\[rank {rank}\] flight recorder: #\d+ gloo:{op}\b", r["output"])
        for rank, op in (("0", "all_gather"), ("1", "barrier"))
    }
    assert any(reported.values()), r["output"][-2000:]
    for rank in ("0", "1"):
        assert reported[rank] or f"[rank {rank}] flight recorder:" not in r["output"], rank
    assert 0 < r["stacks_after_s"] < r["timeout_s"]
    assert r["timeout_s"] - 0.5 < r["failed_after_s"] < r["timeout_s"] + 20


@pytest.mark.slow
def test_detail_names_the_rank_branch_mismatch():
    r = detail()
    assert r["returncode"] != 0 and r["line"]
    own = diagnosis.own_collectives(r["output"])
    assert {rank: c["op"] for rank, c in own.items()} == {"0": "ALLREDUCE", "1": "_ALLGATHER_BASE"}
    assert own["0"]["sequence"] == own["1"]["sequence"]  # the same call, a different collective
    assert r["diagnosed_after_s"] < 10  # no timeout waited (COURSE_TIMEOUT_S=60)


@pytest.mark.slow
def test_one_rank_out_of_memory_root_cause_names_the_rank_and_its_traceback():
    r = crash()
    cause = r["root_cause"]
    assert cause["rank"].startswith("1 ") and cause["exitcode"].startswith("1")
    assert "DefaultCPUAllocator: can't allocate memory" in cause["exception"]
    callstack = cause["error_file_json"]["message"]["extraInfo"]["py_callstack"]
    assert "self.fc(x)" in callstack and "08_troubleshooting/train.py" in callstack
    echo = {o["rank"].split()[0]: o["exception"] for o in cause["others"]}
    # rank 0: only an echo (or stopped first)
    assert re.search("Connection closed by peer|SIGTERM", echo["0"])


@pytest.mark.slow
def test_oom_message_names_the_activation():
    line = next(
        said
        for said in crash()["output"].splitlines()
        if "can't allocate memory" in said and "[rank 1]" in said
    )
    size = int(re.search(r"allocate (\d+) bytes", line).group(1))
    # rows x seq x 4 d_model x fp32: the MLP's hidden activation
    assert size == 256 * 64 * 4 * 64 * 4


@pytest.mark.slow
def test_two_nodes_hsdp_bytes_by_link():
    r = two_nodes()
    assert r["returncodes"] == [0, 0], r["outputs"]
    m = r["metrics"]["results"]
    assert m["nodes"] == [0, 0, 1, 1] and m["mesh"] == {
        "shape": [2, 2],
        "names": ["replicate", "shard"],
    }
    measured = {
        scope: {k: v["bytes"] for k, v in kinds.items()}
        for scope, kinds in m["collectives"].items()
    }
    assert measured == m["theory"]
    assert set(measured["intra"]) == {"all_gather", "reduce_scatter"} and set(
        measured["inter"]
    ) == {"all_reduce"}
    flat = {
        scope: {k: v["bytes"] for k, v in kinds.items()}
        for scope, kinds in m["flat"]["collectives"].items()
    }
    assert flat == m["flat"]["theory"] and flat["intra"] == {}
    assert sum(flat["inter"].values()) > 5 * sum(measured["inter"].values())
    assert m["grad_check"]["max_abs_diff"] < 1e-6
    assert any("node_rank is only used for static rdzv_backend" in out for out in r["outputs"])


@pytest.mark.slow
def test_a_killed_node_restarts_from_the_checkpoint_and_ends_bitwise_equal():
    r = node_fault()
    assert r["returncodes"] == [0, 0], r["outputs"]
    m = r["metrics"]["results"]
    assert m["nodes"] == [0, 1] and m["mesh"] == {"shape": [2, 1], "names": ["replicate", "shard"]}
    # a shard dimension of size 1: no all-gather, no reduce-scatter;
    # only the all-reduce, across the nodes
    assert m["collectives"]["intra"] == {} and set(m["collectives"]["inter"]) == {"all_reduce"}
    assert m["restart_count"] == 1 and m["resumed_from"] == 4
    # node 1 (rank 1) was killed
    assert max(m["restart_counts"]) == 1 and m["restart_counts"][1:] == [1]
    assert m["bitwise"]["equal"] and m["bitwise"]["tensors"] > 0
    assert m["grad_check"]["max_abs_diff"] < 1e-6  # after the resume, from the loaded weights


@pytest.mark.slow
def test_tensor_parallel_times_fsdp_on_four_ranks():
    from course_lab.notebook import launch_lesson

    # the notebook's opt-in cell
    run = launch_lesson(8, "tensor_parallel", timeout=300)  # the notebook's opt-in cell
    assert run.returncode == 0, run.stdout[-3000:]
    m = run.metrics["results"]
    assert m["mesh"] == {"shape": [2, 2], "names": ["dp", "tp"]}
    g = m["grad_check"]
    assert g["max_abs_diff"] < 1e-6 and abs(g["loss"] - g["reference_loss"]) < 1e-5
    placements = {p["name"]: p["placements"] for p in m["placements"]}
    # docs/ecosystem.md: FSDP's Shard(0) is strided only where TP sharded that dim (column-wise fc)
    assert placements["blocks.0.mlp.fc.weight"] == "_S(0, 2), S(0)"
    assert placements["blocks.0.mlp.proj.weight"] == "S(0), S(1)"  # row-wise: TP's Shard(1)
    assert placements["blocks.0.attn.qkv.weight"] == "S(0)"  # attention is not TP-split
    assert m["collectives"]["intra"]["all_reduce"]["bytes"] == m["theory"]["intra"]["all_reduce"]


@pytest.mark.slow
def test_accelerate_launch_on_cpu_is_not_fsdp_and_the_mapping_holds_the_same_bytes(tmp_path):
    pytest.importorskip(
        "accelerate", reason="accelerate is in the course's requirements: bash launch/setup.sh"
    )
    metrics = tmp_path / "accelerate.json"
    r = run_cmd(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            LESSON / "accelerate_fsdp.yaml",
            LESSON / "accelerate_fsdp.py",
            "--metrics",
            metrics,
        ],
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "PROBLEM DETECTED: accelerate set up DistributedType.NO with num_processes=1" in r.stdout
    m = json.loads(metrics.read_text())["results"]
    assert m["accelerate"]["processes_started"] == 2 and m["accelerate"]["num_processes"] == 1
    assert m["measured"] == m["theory"] and m["units"] == 5


# --- the exercise ---------------------------------------------------------------------------------


def load_solution():
    spec = importlib.util.spec_from_file_location(
        "sol8", REPO_ROOT / "solutions" / "lesson8_fix_the_job.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.evaluate


def test_untouched_exercise_is_not_attempted():
    def evaluate(model, batch, env):
        raise NotImplementedError("diagnose the broken job first")

    with pytest.raises(NotImplementedError):
        check_fix_the_job(evaluate)


@pytest.mark.slow
def test_exercise_solution_passes():
    passed, message = check_fix_the_job(load_solution())
    assert passed, message


@pytest.mark.slow
def test_exercise_broken_job_fails_in_bounded_time():
    import broken_evaluate

    passed, message = check_fix_the_job(broken_evaluate.evaluate, timeout_s=5)
    assert not passed and "the job still fails" in message, message


def test_background_returns_once_its_job_has_started():
    """The notebook starts its slow jobs together with jobs.background: the call returns when the
    job's command is printed, not when the job ends; .result() then waits for it."""
    import os
    import time
    import uuid

    def slow_job():
        return jobs.Job(["sleep", "3"], dict(os.environ)).wait(timeout=30)

    start = time.monotonic()
    future = jobs.background(f"sleep-{uuid.uuid4().hex}", slow_job)
    assert time.monotonic() - start < 2.5 and not future.done()
    assert future.result() == 0


def test_bad_layouts_are_one_line_errors():
    """runs.validate raises CourseError (one line, exit 2 under distributed()) before any mesh
    is built; checked without a launch."""
    from types import SimpleNamespace

    from fsdp_course.dist import CourseError

    runs = lesson_script(8, "runs")  # this lesson's, not another lesson's runs.py on the path

    env = SimpleNamespace(world_size=2)
    for flags, words in [
        ({"replicas": 3}, "--replicas 3 must divide the world size 2"),
        ({"replicas": 2, "tp": 2}, "pick one"),
        ({"kill_node_at_step": 3}, "needs MAX_RESTARTS=1 and --ckpt-every N"),
    ]:
        cfg = SimpleNamespace(
            **{"replicas": 1, "tp": 1, "kill_node_at_step": None, "ckpt_every": 0, **flags}
        )
        with pytest.raises(CourseError, match=re.escape(words)):
            runs.validate(cfg, env)
