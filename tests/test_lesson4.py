"""Lesson 4 (checkpointing) under torchrun on CPU ranks: the measured facts from the metrics.

Launches: the state-dict demo (1), the rank-0-only hang (1), resharding 4 -> 2 -> 3 (3), a crash
between saves and a crash inside a save (2, each restarted once), a mismatched checkpoint and a
crash without restarts (2).
"""
import json

import pytest

import quizzes
from fsdp_course.checkpoint import check_loadable
from fsdp_course.dist import CourseError
from course_lab.exercises.lesson4 import check_dcp_save_load


def launch(run_launcher, tmp_path, name, *args, nproc=2, env=None, timeout=300):
    metrics = tmp_path / f"{name}.json"
    env = {"NPROC": str(nproc), **(env or {})}
    r = run_launcher("lesson4.sh", *args, "--metrics", metrics, env=env, timeout=timeout)
    return r, (json.loads(metrics.read_text()) if metrics.is_file() else None)


def ok(r, m):
    assert r.returncode == 0 and m is not None, r.stdout[-2000:] + r.stderr[-3000:]
    return m["results"]


@pytest.mark.slow
def test_state_dict_types_round_trip_and_torch_save_pitfall(run_launcher, tmp_path):
    r, m = launch(run_launcher, tmp_path, "demo", "--demo", "torch-save,types", "--steps", "2",
                  "--ckpt-dir", tmp_path / "ckpt")
    results = ok(r, m)
    pitfall = results["torch_save"]
    full_bytes = 4 * pitfall["num_params"]
    # every rank wrote the full model (the default FULL_STATE_DICT all-gathered it) ...
    assert [p["model_bytes"] for p in pitfall["per_rank"]] == [full_bytes, full_bytes]
    assert all(p["collectives"]["all_gather"]["calls"] > 0 for p in pitfall["per_rank"])
    # ... but only its shard of the optimizer state, keyed by flat parameter, which plain AdamW refuses
    assert pitfall["per_rank"][0]["optim_keys"] == [0, 1, 2]
    assert pitfall["per_rank"][0]["optim_bytes"] < 2 * full_bytes
    loads = {row["what"].split(".")[0]: row for row in pitfall["loads"]}
    assert loads["plain GPT"]["ok"] and not loads["plain AdamW"]["ok"]
    assert "parameter group" in loads["plain AdamW"]["message"]

    rows = {row["state dict"]: row for row in results["types"]["rows"]}
    assert set(rows) == {"FULL_STATE_DICT", "SHARDED_STATE_DICT", "LOCAL_STATE_DICT", "DCP get_state_dict"}
    assert all(row["round trip equal"] for row in rows.values())
    full = rows["FULL_STATE_DICT"]
    # rank0_only: rank 0 holds model + both Adam slots (3 x the parameter bytes) + a 4-byte step
    # count per parameter tensor; the others hold nothing
    assert full["bytes held max other rank"] == 0
    assert full["bytes held rank 0"] == 3 * results["types"]["param_bytes"] + 4 * pitfall["per_rank"][0]["model_tensors"]
    assert full["files"] == 1
    for kind in ("SHARDED_STATE_DICT", "DCP get_state_dict"):
        assert rows[kind]["files"] == 3  # one per rank + .metadata
        assert rows[kind]["bytes held rank 0"] < 0.55 * full["bytes held rank 0"]
    assert rows["LOCAL_STATE_DICT"]["files"] == 2


def test_rank0_only_state_dict_fails_in_bounded_time(run_launcher, tmp_path):
    r, _ = launch(run_launcher, tmp_path, "hang", "--bug", "rank0-only", "--steps", "1",
                  "--ckpt-dir", tmp_path / "ckpt", env={"COURSE_TIMEOUT_S": "3"}, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "Timed out" in out and "COURSE_TIMEOUT_S=3" in out
    assert "Traceback" not in out


@pytest.mark.slow
def test_dcp_reshard_4_to_2_to_3(run_launcher, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    saved = ok(*launch(run_launcher, tmp_path, "s4", "--save", a, "--steps", "3", nproc=4))
    assert len([f for f in saved["save_files"] if f["file"].endswith(".distcp")]) == 4
    two = ok(*launch(run_launcher, tmp_path, "l2", "--load", a, "--steps", "5", "--save", b))
    assert two["equal_to_saved"]["equal"], two["equal_to_saved"]
    assert two["equal_to_saved"]["tensors"] > 50  # model and optimizer tensors
    three = ok(*launch(run_launcher, tmp_path, "l3", "--load", b, nproc=3))
    assert three["equal_to_saved"]["equal"], three["equal_to_saved"]
    assert three["loaded"] == two["saved"] != two["loaded"]  # two trained steps 3 -> 5 in between


@pytest.mark.slow
def test_crash_restarts_resumes_and_ends_bitwise_equal(run_launcher, tmp_path):
    # the command: no MAX_RESTARTS given, launch/lesson4.sh allows one restart itself
    r, m = launch(run_launcher, tmp_path, "crash", "--crash-at-step", "5", "--ckpt-dir", tmp_path / "ckpt",
                  env={"MAX_RESTARTS": None})
    results = ok(r, m)
    assert "simulated crash at step 5" in r.stdout + r.stderr
    assert results["restart_count"] == 1 and results["resumed_from"] == 4
    assert results["equal_restored"]["equal"] and results["equal_restored"]["from_step"] == 4
    assert results["equal_uninterrupted"]["equal"] and results["equal_uninterrupted"]["from_step"] == 0
    assert results["equal_uninterrupted"]["tensors"] > 50
    assert [row["step"] for row in m["history"]] == [4, 5, 6, 7]  # the second attempt's steps


@pytest.mark.slow
def test_killed_save_leaves_previous_checkpoint_loadable(run_launcher, tmp_path):
    ckpt_dir = tmp_path / "ckpt"
    r, m = launch(run_launcher, tmp_path, "crash_save", "--crash-at-step", "8", "--crash-in", "save",
                  "--ckpt-dir", ckpt_dir, env={"MAX_RESTARTS": "1"})
    results = ok(r, m)
    assert results["partial_found"] == [{"dir": ".tmp-step_000008", "files": ["__0_0.distcp", "__1_0.distcp"]}]
    assert results["resumed_from"] == 4  # the previous, complete checkpoint
    assert results["equal_uninterrupted"]["equal"]
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["step_000004", "step_000008"]  # no .tmp left


def test_mismatched_checkpoint_and_missing_restarts_are_one_line_errors(run_launcher, tmp_path):
    # a "checkpoint" of another model: written here, in one process, with DCP
    import torch
    import torch.distributed.checkpoint as dcp

    other = tmp_path / "other"
    dcp.save({"model": {"tok_emb.weight": torch.zeros(27, 32)}}, checkpoint_id=other)
    r, _ = launch(run_launcher, tmp_path, "bad", "--load", other)
    err = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert any(line.startswith("error: ") and "saved from another model" in line and "[27, 32]" in line
               for line in err), r.stderr
    assert "Traceback" not in r.stderr

    r, _ = launch(run_launcher, tmp_path, "norestart", "--crash-at-step", "5", env={"MAX_RESTARTS": "0"})
    assert r.returncode == 2 and "MAX_RESTARTS=1 bash launch/lesson4.sh --crash-at-step" in r.stderr
    assert "simulated crash" not in r.stdout


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


def test_exercise_checker_without_launches(tmp_path):
    def save(path, model, optimizer):
        raise NotImplementedError

    def load(path, model, optimizer):
        raise NotImplementedError

    with pytest.raises(NotImplementedError):
        check_dcp_save_load(save, load=load)
    passed, message = check_dcp_save_load(save)
    assert not passed and "load=load" in message


def test_quiz_open_question_graded_in_english_and_chinese():
    right_en = ("Each rank only holds its own shard, so a full state dict needs an all-gather "
                "collective on every rank, and the optimizer state is sharded too.")
    right_zh = "每个 rank 只有自己的分片，完整 state dict 需要所有 rank 做 all-gather，优化器状态也是分片的。"
    for answer, lang in ((right_en, "en"), (right_zh, "zh")):
        r = quizzes.grade("lesson4", "q_why_not_torch_save", answer, lang)
        assert r.correct, r.feedback
    for answer, lang in (("Because the file would be too big to upload.", "en"), ("因为文件太大了。", "zh")):
        r = quizzes.grade("lesson4", "q_why_not_torch_save", answer, lang)
        assert not r.correct and r.feedback.strip()
    assert not quizzes.grade("lesson4", "q_rank0_only_hang", "a", "en").correct
    assert quizzes.grade("lesson4", "q_rank0_only_hang", "b", "zh").correct
