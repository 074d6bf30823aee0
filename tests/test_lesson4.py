"""Lesson 4 (checkpointing) under torchrun on CPU ranks: the measured facts from the metrics.

The notebook's launches are made here with exactly its flags, paths and NPROC, so a test run
starts each of them once (tests/run_cache.py shares them): the main run (killed
once inside a save, resumed, then the state-dict tour), the rank-0-only hang, the load on 3 ranks
and the exercise's check of the solution. Only the tests start: classic FSDP's offload on CPU
ranks, the exercise's check of section 3's own functions (it must fail), and on 1 rank a crash
between saves and a checkpoint of another model. The other bad inputs go through the script's
own checks in this process.
"""

import importlib.util
from datetime import timedelta
from pathlib import Path

import pytest
import torch

import quizzes
from course_lab.exercises.lesson4 import check_dcp_save_load
from course_lab.notebook import REPO
from fsdp_course.checkpoint import check_loadable, compare_fingerprints, partial, published
from fsdp_course.config import parse_config
from fsdp_course.dist import CourseError
from helpers import lesson_script
from lesson_runs import launch, ok

WORK = REPO / "runs" / "lesson4" / "notebook"  # the notebook's folder: the same launches
RUN = WORK / "run"


def results(run, metrics) -> dict:
    ok(run)
    assert metrics is not None, run.stdout[-2000:]
    return metrics["results"]


@pytest.fixture(scope="module")
def main_run():
    """The notebook's main launch: rank 1 is killed inside the step-8 save on the first attempt;
    the restarted job resumes, then runs the state-dict tour. (run, metrics)"""
    return launch(4, "main", ckpt_dir=RUN)  # lessons/04_checkpointing/launches.toml


@pytest.fixture(scope="module")
def main(main_run):
    return results(*main_run)


@pytest.mark.slow
def test_torch_save_writes_a_full_copy_with_classic_fsdp_and_a_part_with_fsdp2(main):
    pitfall = main["torch_save"]
    full_bytes = 4 * pitfall["num_params"]
    classic, fsdp2 = pitfall["classic"], pitfall["fsdp2"]
    # classic: the default FULL_STATE_DICT all-gathered every unit, every rank wrote the model ...
    assert [r["model bytes held"] for r in classic] == [full_bytes, full_bytes]
    assert all(r["collectives"]["all_gather"]["calls"] > 0 for r in classic)
    # ... but only its shard of the optimizer state, keyed by flat parameter,
    # which plain AdamW refuses
    assert classic[0]["optim_keys"] == [0, 1, 2]
    loads = {row["what"].split(".")[0]: row for row in pitfall["classic_loads"]}
    assert loads["plain GPT"]["ok"] and not loads["plain AdamW"]["ok"]
    assert "parameter group" in loads["plain AdamW"]["message"]
    # FSDP2: DTensors whose shapes say the whole model, each rank holding its part; nothing gathered
    assert all(r["tensor type"] == "DTensor" and r["collectives"] == {} for r in fsdp2)
    assert all(r["model bytes the shapes say"] == full_bytes > r["model bytes held"] for r in fsdp2)
    assert sum(r["model bytes held"] for r in fsdp2) == full_bytes
    refused, loaded, as_dtensors, as_parts = pitfall["fsdp2_loads"]
    assert not refused["ok"] and "torch.distributed.tensor`` must be imported" in refused["message"]
    assert loaded["ok"] and "shape [27, 64], holds [14, 64]" in loaded["message"]
    assert not as_dtensors["ok"] and "mixed torch.Tensor and DTensor" in as_dtensors["message"]
    assert not as_parts["ok"] and "size mismatch" in as_parts["message"]


@pytest.mark.slow
def test_state_dict_types_classic_gathers_fsdp2_does_not_ddp_is_written_once(main):
    types = main["types"]
    rows = {row["state dict"]: row for row in types["rows"]}
    assert list(rows) == [
        "classic FULL_STATE_DICT",
        "classic SHARDED_STATE_DICT",
        "classic LOCAL_STATE_DICT",
        "classic get_state_dict",
        "FSDP2 get_state_dict",
        "DDP get_state_dict",
    ]
    assert all(row["round trip equal"] for row in rows.values())
    assert types["from_classic"] == {"FSDP2": True, "DDP": True}
    param_bytes = types["param_bytes"]
    full = rows["classic FULL_STATE_DICT"]
    # rank0_only: rank 0 holds model + both Adam slots + a 4-byte step per parameter tensor
    assert full["held max other"] == 0 and full["files"] == 1
    assert full["held rank 0"] == 3 * param_bytes + 4 * types["param_tensors"]
    # classic SHARDED (and get_state_dict, which uses it) all-gathers every unit: the whole
    # model, padded by at most N-1 elements per unit (3 units, 2 ranks); FSDP2 gathers nothing
    for kind in ("classic SHARDED_STATE_DICT", "classic get_state_dict"):
        assert param_bytes <= rows[kind]["model gathered"] <= param_bytes + 4 * 3
        assert rows[kind]["files"] == 3 and rows[kind]["held rank 0"] < 0.55 * full["held rank 0"]
    assert rows["classic LOCAL_STATE_DICT"]["model gathered"] < 0.05 * param_bytes
    assert rows["classic LOCAL_STATE_DICT"]["files"] == 2
    for kind in ("FSDP2 get_state_dict", "DDP get_state_dict"):
        assert rows[kind]["model gathered"] == rows[kind]["optim gathered"] == 0
    assert rows["classic get_state_dict"]["optim gathered"] > 0
    # DDP: every rank holds everything, DCP writes it once: fewer data bytes than FSDP2's one copy
    ddp, fsdp2 = rows["DDP get_state_dict"], rows["FSDP2 get_state_dict"]
    assert ddp["held rank 0"] == ddp["held max other"] == full["held rank 0"]
    assert (
        ddp["file bytes"] - ddp["of which .metadata"]
        < fsdp2["file bytes"] - fsdp2["of which .metadata"]
    )
    assert types["warning"].startswith(
        "FutureWarning: FSDP.state_dict_type() and FSDP.set_state_dict_type() are being deprecated"
    )


@pytest.mark.slow
def test_rng_state_is_written_once_so_a_seed_per_rank_is_lost(main):
    rows = main["rng"]["rows"]
    same = [r for r in rows if r["case"] == "same seed"]
    per_rank = [r for r in rows if r["case"] == "seed per rank"]
    assert len(same) == len(per_rank) == 2 and all(r["own state back"] for r in same)
    assert len({r["saved RNG"] for r in per_rank}) == 2  # two streams went in ...
    assert len({r["restored RNG"] for r in per_rank}) == 1  # ... one came back, to both ranks
    assert sorted(r["own state back"] for r in per_rank) == [False, True]
    assert all(
        r["next rand() after load"] != r["next rand() expected"]
        for r in per_rank
        if not r["own state back"]
    )
    assert all(len(files.split(", ")) == 1 for files in main["rng"]["rng_file"].values())


@pytest.mark.slow
def test_resume_is_bitwise_model_optimizer_and_rng(main):
    for name, first in (("restored", 4), ("uninterrupted", 0)):
        verdict = main[f"equal_{name}"]
        assert verdict["equal"] and verdict["from_step"] == first, verdict
        assert (
            verdict["tensors"] == len(main["final"])
            and sum(k.startswith("rng.") for k in main["final"]) == 2
        )
    assert sorted(f["file"] for f in main["checkpoint_files"]) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
    ]


@pytest.mark.slow
def test_load_on_3_ranks_what_2_saved(main):
    three = results(*launch(4, "load_on_3", checkpoint=RUN / "step_000008"))
    verdict = compare_fingerprints(main["final"], three["loaded"], only=("model.", "optim."))
    assert verdict["equal"] and verdict["tensors"] > 100, verdict


def test_rank0_only_state_dict_fails_in_bounded_time():
    run, _ = launch(4, "hang", ckpt_dir=WORK / "hang")  # the notebook's launch
    assert run.returncode != 0
    assert "Timed out" in run.stdout and "COURSE_TIMEOUT_S=2" in run.stdout
    assert "Traceback" not in run.stdout


def test_default_collective_timeouts_from_torch_source():
    """What the notebook prints next to the hang (fsdp_course.dist.default_timeouts): gloo's
    default from the Python constant, NCCL's from the C++ header a CPU-only build still ships."""
    from fsdp_course.dist import default_timeouts

    defaults = default_timeouts()
    assert defaults["gloo"][0] == timedelta(minutes=30)
    assert defaults["nccl"][0] == timedelta(minutes=10)
    assert "kProcessGroupNCCLDefaultTimeout = 10 * 60 * 1000 ms" in defaults["nccl"][1]
    header = (
        Path(torch.__file__).parent / "include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp"
    )
    text = " ".join(header.read_text().split())
    assert "kProcessGroupNCCLDefaultTimeout = std::chrono::milliseconds(10 * 60 * 1000)" in text


def test_offload_to_cpu_fails_on_cpu_ranks_in_one_line():
    run, _ = launch(4, "--bug", "offload-cpu", "--steps", "1", "--ckpt-dir", WORK / "offload")
    assert run.returncode == 1
    assert any(
        line.startswith("[rank 0] error: RuntimeError: setStorage") and "out of bounds" in line
        for line in run.stderr.splitlines()
    ), run.stderr[-2000:]
    assert "Traceback" not in run.stdout


@pytest.mark.slow
def test_killed_save_leaves_previous_checkpoint_loadable(main_run):
    run, metrics = main_run
    found = results(run, metrics)
    assert "simulated crash while saving .tmp-step_000008" in run.stdout
    # the previous, complete checkpoint
    assert found["restart_count"] == 1 and found["resumed_from"] == 4
    assert found["partial_found"] == [
        {"dir": ".tmp-step_000008", "files": ["__0_0.distcp", "__1_0.distcp"]}
    ]
    # torchrun was allowed one restart: launch/lesson4.sh's own default for --crash-at-step (the
    # notebook gives no MAX_RESTARTS; the next test removes it from the environment to be sure)
    assert "--max-restarts=1 " in run.stdout
    assert found["equal_restored"]["equal"] and found["equal_uninterrupted"]["equal"]
    # no .tmp left
    assert [p.name for p in partial(RUN) + published(RUN)] == ["step_000004", "step_000008"]
    assert [row["step"] for row in metrics["history"]] == [4, 5, 6, 7]  # the second attempt's steps


@pytest.mark.slow
def test_crash_between_saves_restarts_and_resumes(tmp_path):
    # the docstring's command: no MAX_RESTARTS given, launch/lesson4.sh allows one restart itself.
    # One rank is enough (it is the one killed); the main launch restarts 2 ranks.
    run, metrics = launch(
        4,
        "--crash-at-step",
        "5",
        "--ckpt-dir",
        tmp_path / "ckpt",
        nproc=1,
        env={"MAX_RESTARTS": None},
    )
    found = results(run, metrics)
    assert "[rank 0] simulated crash at step 5" in run.stdout and "--max-restarts=1 " in run.stdout
    assert found["restart_count"] == 1 and found["resumed_from"] == 4
    assert found["equal_restored"]["equal"] and found["equal_uninterrupted"]["equal"]


def test_mismatched_checkpoint_is_a_one_line_error(tmp_path):
    import torch.distributed.checkpoint as dcp

    other = tmp_path / "other"  # a "checkpoint" of another model, written here in one process
    dcp.save({"model": {"tok_emb.weight": torch.zeros(27, 32)}}, checkpoint_id=other)
    run, _ = launch(4, "--load", other, nproc=1)
    assert run.returncode == 2, run.stderr
    assert any(
        line.startswith("error: ") and "saved from another model" in line and "[27, 32]" in line
        for line in run.stderr.splitlines()
    ), run.stderr
    assert "Traceback" not in run.stderr


def test_missing_restarts_and_keep_0_are_one_line_errors(capsys, monkeypatch):
    """What train.py checks before training, in this process: its flags (parse_config), then
    the flags that need periodic checkpoints (runs.periodic_checkpoints). Through torchrun a
    CourseError is one line and exit 2: the previous test."""
    train = lesson_script(4)
    with pytest.raises(SystemExit) as exited:  # would prune the checkpoint a resume needs
        parse_config(train.Config, train.__doc__, argv=["--keep", "0"])
    assert exited.value.code == 2
    assert "argument --keep: must be at least 1, got 0" in capsys.readouterr().err
    # MAX_RESTARTS=0 bash launch/lesson4.sh --crash-at-step 5: the launcher passes
    # --max-restarts=0 on, and torchrun tells every rank in TORCHELASTIC_MAX_RESTARTS
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "0")
    cfg = parse_config(train.Config, train.__doc__, argv=["--crash-at-step", "5"])
    with pytest.raises(CourseError) as refused:
        train.runs.periodic_checkpoints(cfg)
    assert "MAX_RESTARTS=1 bash launch/lesson4.sh --crash-at-step" in str(refused.value)
    assert "\n" not in str(refused.value)
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")  # what the launcher gives it by default
    assert train.runs.periodic_checkpoints(cfg)


def test_check_loadable_messages(tmp_path):
    with pytest.raises(CourseError, match="does not exist"):
        check_loadable(tmp_path / "nope")
    half = tmp_path / ".tmp-step_000008"
    half.mkdir()
    (half / "__0_0.distcp").write_bytes(b"x")
    with pytest.raises(CourseError, match="half-written"):
        check_loadable(half)
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    (ranks / "rank0.pt").write_bytes(b"x")
    with pytest.raises(CourseError, match="per-rank torch.save"):
        check_loadable(ranks)


def test_exercise_checker_without_launches():
    def save(path, model, optimizer):
        raise NotImplementedError

    def load(path, model, optimizer):
        raise NotImplementedError

    with pytest.raises(NotImplementedError):
        check_dcp_save_load(save, load=load)
    passed, message = check_dcp_save_load(save)
    assert not passed and "load=load" in message


def _functions(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.save, module.load


@pytest.mark.slow
def test_exercise_passes_the_solution(tmp_path):
    # the notebook's launch
    save, load = _functions(REPO / "solutions" / "lesson4_dcp_save_load.py")
    passed, message = check_dcp_save_load(save, load=load)
    assert passed, message


@pytest.mark.slow
def test_exercise_fails_section_3s_functions_and_says_which_rank(tmp_path):
    """The script's own save/load (one RNG key for all ranks) restore model and optimizer: the
    check must fail them, naming the rank that came back with another rank's RNG state."""
    module = tmp_path / "section3.py"
    module.write_text("""import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def save(path, model, optimizer):
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save(
        {"model": model_sd, "optim": optim_sd, "rng": torch.get_rng_state()}, checkpoint_id=path
    )


def load(path, model, optimizer):
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "rng": torch.get_rng_state()}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(
        model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    torch.set_rng_state(state["rng"])
""")
    passed, message = check_dcp_save_load(*_functions(module))
    assert not passed
    assert "model and optimizer came back" in message and "came back with rank" in message, message


def test_quiz_open_question_graded_in_english_and_chinese():
    right_en = (
        "Each rank only holds its own shard, so a full state dict needs an all-gather "
        "collective on every rank, and the optimizer state is sharded too."
    )
    right_zh = (
        "每个 rank 只有自己的分片，完整 state dict 需要所有 rank 做 all-gather，"
        "优化器状态也是分片的。"
    )
    for answer, lang in ((right_en, "en"), (right_zh, "zh")):
        r = quizzes.grade("lesson4", "q_why_not_torch_save", answer, lang)
        assert r.correct, r.feedback
    for answer, lang in (
        ("Because the file would be too big to upload.", "en"),
        ("因为文件太大了。", "zh"),
    ):
        r = quizzes.grade("lesson4", "q_why_not_torch_save", answer, lang)
        assert not r.correct and r.feedback.strip()
    assert not quizzes.grade("lesson4", "q_rank0_only_hang", "a", "en").correct
    assert quizzes.grade("lesson4", "q_rank0_only_hang", "b", "zh").correct
