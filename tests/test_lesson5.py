"""Lesson 5 (FSDP2) under torchrun on CPU ranks: DTensor layout, each --bug detected, classic
FSDP vs FSDP2 losses, collectives vs theory, the compile path and the migration exercise."""
from __future__ import annotations

import importlib.util
import json
import math

import pytest

from fsdp_course import fsdp2, theory
from course_lab.exercises.lesson5 import check_shard

MAIN_VARIANTS = ";".join([
    "bug=meta-buffers", "bug=optimizer-first",  # first, so the masks do not land in reused memory
    "reshard-after-forward=true", "reshard-after-forward=false", "reshard-after-forward=1",
    "mixed-precision=true", "prefetch=2", "grad-accum=2", "cpu-offload=true", "replicas=2",
    "api=classic", "api=classic,reshard-after-forward=false", "api=classic,grad-accum=2",
    "bug=compile-whole,compile-backend=aot_eager",
])


def launch(run_launcher, tmp_path, *args, nproc=2, name="metrics.json", timeout=300):
    metrics = tmp_path / name
    r = run_launcher("lesson5.sh", *args, "--metrics", metrics, env={"NPROC": nproc}, timeout=timeout)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return json.loads(metrics.read_text()), r


@pytest.fixture(scope="module")
def main_run(tmp_path_factory):
    from helpers import REPO_ROOT, run_cmd
    tmp = tmp_path_factory.mktemp("lesson5")
    metrics = tmp / "metrics.json"
    r = run_cmd(["bash", REPO_ROOT / "launch" / "lesson5.sh", "--steps", "3", "--log-every", "3",
                 "--variants", MAIN_VARIANTS, "--metrics", metrics], env={"NPROC": 2}, timeout=400)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    m = json.loads(metrics.read_text())
    return m, {run["label"]: run for run in m["results"]["runs"]}, r.stdout


def losses(run):
    return [h["loss"] for h in run["history"]]


@pytest.mark.slow
def test_dtensor_placements_and_full_tensor(main_run):
    m, runs, out = main_run
    rows = runs["fsdp2 raf=true"]["dtensor"]
    assert len(rows) == 54
    for row in rows:
        assert row["placements"] == "S(0)", row
        assert row["local"] == [theory.fsdp2.local_shape(row["global"], 2, r) for r in range(2)], row
        assert row["full_equal"] is True, row
    emb = next(r for r in rows if r["name"] == "tok_emb.weight")
    assert emb["local"] == [[14, 128], [13, 128]]
    assert "DTensor parameters" in out and "full_tensor() == reference" in out
    hsdp = runs["fsdp2 raf=true hsdp 2x"]["dtensor"]
    assert all(r["placements"] == "R, S(0)" and r["local"] == [r["global"]] * 2 for r in hsdp)


@pytest.mark.slow
def test_each_bug_is_detected_and_the_fix_is_clean(main_run):
    m, runs, out = main_run
    meta = runs["fsdp2 raf=true bug=meta-buffers"]["checks"]
    assert meta["mask_errors"] > 0 and not meta["loss0_matches_reference"]
    first = runs["fsdp2 raf=true bug=optimizer-first"]
    assert not first["checks"]["optimizer_holds_model_params"]
    assert first["checks"]["params_changed"] == 0 and first["memory"]["optimizer"] == 0
    whole = runs["fsdp2 raf=true compile bug=compile-whole"]
    assert whole["renamed"][0].startswith("_orig_mod.") and "renamed every parameter" in whole["problems"][0]
    assert out.count("PROBLEM DETECTED") >= 4
    for label, run in runs.items():
        if "bug=" not in label:
            assert run["problems"] == [], (label, run["problems"])
            assert run["checks"]["params_changed"] == run["checks"]["num_params"]
            assert run["loss_last"] < run["loss_first"] + 0.5


@pytest.mark.slow
def test_classic_and_fsdp2_losses_equal(main_run):
    m, runs, out = main_run
    for classic, new in [("classic raf=true", "fsdp2 raf=true"), ("classic raf=false", "fsdp2 raf=false"),
                         ("classic raf=true accum=2", "fsdp2 raf=true accum=2")]:
        assert len(losses(runs[classic])) == len(losses(runs[new])) == 3
        assert max(abs(a - b) for a, b in zip(losses(runs[classic]), losses(runs[new]))) < 1e-5
        assert runs[classic]["fsdp_units"] == runs[new]["fsdp_units"] == 5
    for label in ["fsdp2 raf=false", "fsdp2 raf=1", "fsdp2 raf=true prefetch=2", "fsdp2 raf=true offload"]:
        assert max(abs(a - b) for a, b in zip(losses(runs[label]), losses(runs["fsdp2 raf=true"]))) < 1e-5
    bf16 = runs["fsdp2 raf=true bf16"]
    assert max(abs(a - b) for a, b in zip(losses(bf16), losses(runs["fsdp2 raf=true"]))) < 2e-2


@pytest.mark.slow
def test_memory_and_collectives_match_theory(main_run):
    m, runs, out = main_run
    rows = runs["fsdp2 raf=true"]["dtensor"]
    shapes = [r["global"] for r in rows]
    groups = [[r["global"] for r in rows if not r["name"].startswith("blocks.")]] + [
        [r["global"] for r in rows if r["name"].startswith(f"blocks.{i}.")] for i in range(4)]
    state = theory.fsdp2.state_bytes_theory(shapes, 2, rank=0)
    for label, raf in [("fsdp2 raf=true", True), ("fsdp2 raf=false", False), ("fsdp2 raf=1", 1)]:
        run = runs[label]
        for key in ("params", "grads", "optimizer"):
            assert run["memory"][key] == state[key], (label, key)
        measured = {k: v["bytes"] for k, v in run["collectives"].items()}
        assert measured == theory.fsdp2.collective_bytes_theory(groups, 2, raf, root_reshards=raf is True), label
    base = runs["fsdp2 raf=true"]["memory"]
    assert runs["fsdp2 raf=false"]["memory"]["gathered"] > base["gathered"]  # kept until backward
    assert runs["fsdp2 raf=true bf16"]["memory"]["gathered"] * 2 == pytest.approx(base["gathered"], rel=0.02)
    assert runs["fsdp2 raf=true prefetch=2"]["memory"]["all_gather_buffer"] > base["all_gather_buffer"]
    accum = runs["fsdp2 raf=true accum=2"]
    assert accum["memory"]["unsharded_grads"] > base["unsharded_grads"]
    assert accum["collectives"]["all_gather"]["bytes"] == 2 * runs["fsdp2 raf=true"]["collectives"]["all_gather"]["bytes"]
    assert accum["collectives"]["reduce_scatter"] == runs["fsdp2 raf=true"]["collectives"]["reduce_scatter"]
    for run in runs.values():
        if run["history"]:
            assert run["ms_per_step"] > 0 and run["memory"]["peak"] > 0


@pytest.mark.slow
def test_uneven_shards_on_three_ranks(run_launcher, tmp_path):
    m, _ = launch(run_launcher, tmp_path, "--steps", "2", "--log-every", "2", nproc=3)
    run = m["results"]["runs"][0]
    assert m["world_size"] == 3 and run["problems"] == []
    rows = {r["name"]: r for r in run["dtensor"]}
    assert rows["tok_emb.weight"]["local"] == [[9, 128]] * 3
    assert rows["pos_emb.weight"]["local"] == [[22, 128], [22, 128], [20, 128]]
    assert rows["blocks.0.ln1.weight"]["local"] == [[43], [43], [42]]
    assert all(r["full_equal"] and r["placements"] == "S(0)" for r in run["dtensor"])
    for r in run["dtensor"]:
        assert r["local"] == [theory.fsdp2.local_shape(r["global"], 3, k) for k in range(3)]


@pytest.mark.slow
def test_compile_path_runs(run_launcher, tmp_path):
    m, r = launch(run_launcher, tmp_path, "--variants", "compile=true;compile=false",
                  "--compile-backend", "aot_eager", "--steps", "3", "--log-every", "3", timeout=240)
    compiled, eager = m["results"]["runs"]
    assert compiled["problems"] == [] and compiled["label"].endswith("compile")
    assert max(abs(a - b) for a, b in zip(losses(compiled), losses(eager))) < 1e-4
    assert compiled["first_step_ms"] > 2 * compiled["ms_per_step"]  # compilation on step 0
    assert compiled["fsdp_units"] == 5


@pytest.mark.slow
def test_exercise_solution_passes_and_wrong_answer_fails(main_run, repo_root):
    m, runs, out = main_run
    spec = importlib.util.spec_from_file_location("sol", repo_root / "solutions" / "lesson5_shard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    passed, message = check_shard(module.shard, classic=m)
    assert passed, message

    def shard(model, mesh):
        raise NotImplementedError

    with pytest.raises(NotImplementedError):
        check_shard(shard, classic=m)


def test_root_only_is_rejected(tmp_path):
    """The checker explains a wrong migration (one unit for the whole model) from the metrics."""
    runs = [{"api": "classic", "config": {"steps": 1, "batch_size": 8, "lr": 3e-3, "seed": 0, "n_layers": 4},
             "history": [{"loss": 3.0}]}]
    classic = {"world_size": 2, "results": {"runs": runs}}

    def fake_run(lesson, *args, **kwargs):
        return {"world_size": 2, "results": {"runs": [{"fsdp_units": 1, "dtensor": [], "history": [{"loss": 3.0}]}]}}

    def shard(model, mesh):
        return None

    passed, message = check_shard(shard, classic=classic, run=fake_run)
    assert not passed and "fully_shard on each of model.blocks" in message


def test_bad_variant_is_one_line(run_launcher):
    r = run_launcher("lesson5.sh", "--variants", "nonsense=1", env={"NPROC": 2}, timeout=120)
    assert r.returncode == 2
    assert "cannot read 'nonsense=1'" in r.stderr and "Traceback" not in r.stderr


def test_theory_functions():
    assert [theory.fsdp2.local_rows(27, 2, r) for r in range(2)] == [14, 13]
    assert [theory.fsdp2.local_rows(5, 4, r) for r in range(4)] == [2, 2, 1, 0]
    assert theory.fsdp2.padded_numel([27, 128], 2) == 28 * 128
    assert fsdp2.parse_reshard("false") is False and fsdp2.parse_reshard("2") == 2
    with pytest.raises(ValueError):
        fsdp2.parse_reshard("maybe")
    assert math.isclose(theory.fsdp2.state_bytes_theory([[4, 2]], 2)["optimizer"], 2 * 4 * 4)
