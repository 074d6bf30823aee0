"""Lesson 5 (FSDP2) under torchrun on CPU ranks: the DTensor layout and the padding each rank
stores, each --bug detected and the fixed runs' losses falling, reshard_after_forward's bytes and
what each unit keeps (the int 1 is False; 2 on 4 ranks all-gathers within pairs), classic FSDP vs
FSDP2, the per-step metric line, torch.compile's real failures and the orders that train, and the
exercise's checker.

The launches are the notebook's own, declared once in lessons/05_fsdp2/launches.toml: within one
test run the notebook's test and these share them (tests/run_cache.py); the compile launch is the
tests' own (the notebook runs compiled variants only when asked, one launch per way)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re

import pytest

from course_lab.exercises.lesson5 import check_shard, goal_all_gather_bytes
from fsdp_course import theory
from helpers import REPO_ROOT, lesson_script
from lesson_runs import launch, ok

RUNS = lesson_script(5, "runs")  # lesson 5's runs.py

# The notebook runs these (optionally) one launch each (compile_* in launches.toml), for fair
# compile times; here one launch.
COMPILE_VARIANTS = (
    "compile=none;compile=blocks,fullgraph=true;compile=model-before;compile=model-after"
)
COMPILE = (
    (
        "--steps",
        "3",
        "--log-every",
        "3",
        "--compile-backend",
        "aot_eager",
        "--variants",
        COMPILE_VARIANTS,
    ),
    2,
)


def notebook_launch(name_or_flags):
    """A launch the notebook declares (by name), or the tests' own COMPILE (flags, NPROC)."""
    args, nproc = ((name_or_flags,), None) if isinstance(name_or_flags, str) else name_or_flags
    run, metrics = launch(5, *args, nproc=nproc)
    ok(run)
    return run, metrics, {r["label"]: r for r in metrics["results"]["runs"]}


@pytest.fixture(scope="module")
def main():
    return notebook_launch("main")


@pytest.fixture(scope="module")
def four():
    return notebook_launch("four_ranks")


def losses(run):
    return [h["loss"] for h in run["history"]]


def unit_shapes(rows, n_layers=4):
    return [[r["global"] for r in rows if not r["name"].startswith("blocks.")]] + [
        [r["global"] for r in rows if r["name"].startswith(f"blocks.{i}.")] for i in range(n_layers)
    ]


@pytest.mark.slow
def test_dtensor_layout_and_the_padding_each_rank_stores(main):
    _, m, runs = main
    rows = runs["fsdp2 raf=default"]["dtensor"]
    assert len(rows) == 54  # "0 of 54 shards" in the quiz: measured here
    for row in rows:
        assert row["placements"] == "S(0)" and row["full_equal"] is True, row
        assert row["local"] == [theory.fsdp2.local_shape(row["global"], 2, r) for r in range(2)], (
            row
        )
        stored_rows = theory.fsdp2.stored_rows(row["global"][0], 2) if row["global"] else 1
        every_row = 4 * math.prod(row["global"][1:])
        assert row["stored"] == [stored_rows * every_row] * 2, row  # every rank: chunk 0's size
    emb = next(r for r in rows if r["name"] == "tok_emb.weight")
    assert emb["global"] == [27, 128] and emb["local"] == [[14, 128], [13, 128]]  # q_local_rows: 13
    assert emb["stored"] == [14 * 128 * 4] * 2  # rank 1 stores 14 rows: the padding is stored
    shapes = [r["global"] for r in rows]
    for rank in range(2):
        assert sum(r["stored"][rank] for r in rows) == theory.fsdp2.stored_param_bytes(shapes, 2)
    needed = sum(4 * math.prod(theory.fsdp2.local_shape(s, 2, 1)) for s in shapes)
    assert theory.fsdp2.stored_param_bytes(shapes, 2) > needed  # rank 1 holds padding


@pytest.mark.slow
def test_each_bug_is_detected_and_every_other_run_learns(main):
    run, m, runs = main
    meta = runs["fsdp2 raf=default bug=meta-buffers"]["checks"]
    assert meta["mask_errors"] > 0 and not meta["loss0_matches_reference"]
    first = runs["fsdp2 raf=default bug=optimizer-first"]
    assert not first["checks"]["optimizer_holds_model_params"]
    assert first["checks"]["params_changed"] == 0 and first["checks"]["num_params"] == 54
    assert first["memory"]["optimizer"] == 0
    assert run.stdout.count("PROBLEM DETECTED") >= 3
    for label, r in runs.items():
        if "bug=" in label or not r["history"]:
            continue
        assert r["problems"] == [], (label, r["problems"])
        assert r["checks"]["params_changed"] == r["checks"]["num_params"]
        assert r["loss_last"] < r["loss_first"] - 0.1, (label, losses(r))  # it learns


@pytest.mark.slow
def test_reshard_after_forward_bytes_and_what_each_unit_keeps(main):
    _, m, runs = main
    rows = runs["fsdp2 raf=default"]["dtensor"]
    groups = unit_shapes(rows)
    settings = {
        "fsdp2 raf=default": None,
        "fsdp2 raf=true": True,
        "fsdp2 raf=false": False,
        "fsdp2 raf=1": 1,
    }
    for label, raf in settings.items():
        run = runs[label]
        measured = {k: v["bytes"] for k, v in run["collectives"].items() if k != "by_group"}
        assert measured == theory.fsdp2.collective_bytes_theory(
            groups, 2, raf, root_reshards=True
        ), label
        assert run["memory"]["held_after_forward"] == theory.fsdp2.held_after_forward_bytes(
            groups, 2, [raf] * 5 if raf is not None else None
        ), label
        state = theory.fsdp2.state_bytes_theory([r["global"] for r in rows], 2, rank=0)
        assert all(run["memory"][k] == state[k] for k in ("params", "grads", "optimizer")), label
    kept = {label: [u["keeps"] for u in runs[label]["kept_after_forward"]] for label in settings}
    assert kept["fsdp2 raf=default"] == ["whole"] + ["shard"] * 4  # the root is kept
    assert kept["fsdp2 raf=true"] == ["shard"] * 5
    assert kept["fsdp2 raf=false"] == kept["fsdp2 raf=1"] == ["whole"] * 5  # the int 1 is False
    assert any("reshard_after_forward=1 (int)" in n for n in runs["fsdp2 raf=1"]["notices"])
    # FULL_SHARD is the default, not True: True gathers the root once more per step.
    ag = {k: runs[k]["collectives"]["all_gather"]["bytes"] for k in settings}
    assert (
        ag["fsdp2 raf=true"] - ag["fsdp2 raf=default"]
        == sum(theory.fsdp2.padded_numel(s, 2) for s in groups[0]) * 4
    )
    classic = runs["classic raf=default"]["collectives"]["all_gather"]["bytes"]
    assert abs(classic - ag["fsdp2 raf=default"]) < abs(classic - ag["fsdp2 raf=true"])


@pytest.mark.slow
def test_reshard_to_pairs_on_four_ranks(four):
    _, m, runs = four
    pairs = runs["fsdp2 raf=2"]
    by_group = pairs["collectives"]["by_group"]["all_gather"]
    # Forward: every unit over all 4 ranks; backward: every unit again (the script passes 2 to
    # the root too), within its pair; the same payload per call.
    assert by_group["4"]["calls"] == by_group["2"]["calls"] == 5
    assert (
        by_group["4"]["bytes"]
        == by_group["2"]["bytes"]
        == sum(theory.fsdp2.padded_numel(s, 4) for g in unit_shapes(pairs["dtensor"]) for s in g)
        * 4
    )
    assert [u["keeps"] for u in pairs["kept_after_forward"]] == ["1/2"] * 5
    groups = unit_shapes(pairs["dtensor"])
    held = pairs["memory"]["held_after_forward"]
    assert held == theory.fsdp2.held_after_forward_bytes(groups, 4, 2)
    assert held > 1.9 * pairs["memory"]["params"]  # half of every unit, over its own quarter
    for row in pairs["dtensor"]:  # uneven shards: 27 rows on 4 ranks, every rank stores 7
        assert row["local"] == [theory.fsdp2.local_shape(row["global"], 4, r) for r in range(4)], (
            row
        )
        if row["name"] == "tok_emb.weight":
            assert (
                row["local"] == [[7, 128]] * 3 + [[6, 128]] and row["stored"] == [7 * 128 * 4] * 4
            )


@pytest.mark.slow
def test_classic_and_fsdp2_train_the_same_model(main):
    _, m, runs = main
    for classic, new in [
        ("classic raf=default", "fsdp2 raf=default"),
        ("classic raf=false", "fsdp2 raf=false"),
        ("classic raf=default accum=2", "fsdp2 raf=default accum=2"),
    ]:
        assert len(losses(runs[classic])) == len(losses(runs[new])) == 3
        assert max(abs(a - b) for a, b in zip(losses(runs[classic]), losses(runs[new]))) < 1e-5
        assert runs[classic]["fsdp_units"] == runs[new]["fsdp_units"] == 5
    base = losses(runs["fsdp2 raf=default"])
    for label in [
        "fsdp2 raf=true",
        "fsdp2 raf=false",
        "fsdp2 raf=1",
        "fsdp2 raf=default prefetch=2",
    ]:
        assert max(abs(a - b) for a, b in zip(losses(runs[label]), base)) < 1e-5, label
    assert max(abs(a - b) for a, b in zip(losses(runs["fsdp2 raf=default bf16"]), base)) < 2e-2


@pytest.mark.slow
def test_options_change_the_columns_the_lesson_says(main):
    _, m, runs = main
    base = runs["fsdp2 raf=default"]
    bf16 = runs["fsdp2 raf=default bf16"]
    assert bf16["memory"]["gathered"] * 2 == pytest.approx(base["memory"]["gathered"], rel=0.02)
    assert (
        bf16["collectives"]["all_gather"]["bytes"] * 2 == base["collectives"]["all_gather"]["bytes"]
    )
    assert (
        runs["fsdp2 raf=default prefetch=2"]["memory"]["all_gather_buffer"]
        > base["memory"]["all_gather_buffer"]
    )
    accum = runs["fsdp2 raf=default accum=2"]
    assert accum["memory"]["unsharded_grads"] > base["memory"]["unsharded_grads"]
    assert (
        accum["collectives"]["all_gather"]["bytes"]
        == 2 * base["collectives"]["all_gather"]["bytes"]
    )
    assert accum["collectives"]["reduce_scatter"] == base["collectives"]["reduce_scatter"]
    assert runs["fsdp2 raf=false"]["memory"]["gathered"] > base["memory"]["gathered"]
    for run in runs.values():
        if run.get("memory"):
            assert run["ms_per_step"] > 0 and run["memory"]["peak"] > 0


@pytest.mark.slow
def test_metric_line_prints_only_what_was_measured(main):
    """Steps without the instruments read "-" (not a false 0.000); the measured step shows the
    bytes the same run's summary reports."""
    run, m, runs = main
    block = run.stdout.split("== fsdp2 raf=default ==")[1].split("==")[0]
    lines = [line for line in block.splitlines() if re.match(r"\s+\d+ \|", line)]
    cells = [[c.strip() for c in line.split("|")] for line in lines]
    # the measured step 1 printed despite --log-every 3
    assert [c[0] for c in cells] == ["0", "1", "2"]
    assert cells[0][3:] == cells[2][3:] == ["-", "-"]
    sent = sum(
        v["bytes"] for k, v in runs["fsdp2 raf=default"]["collectives"].items() if k != "by_group"
    )
    assert float(cells[1][4]) == pytest.approx(sent / 2**20, abs=1e-3) and float(cells[1][4]) > 0
    assert float(cells[1][3]) == pytest.approx(
        runs["fsdp2 raf=default"]["memory"]["peak"] / 2**20, abs=0.01
    )
    every_line = re.findall(r"^\s+\d+ \|[^|]+\|[^|]+\|[^|]+\|\s*(\S+)$", run.stdout, re.M)
    # never a false 0
    assert every_line and all(sent == "-" or float(sent) > 0 for sent in every_line)


@pytest.mark.slow
def test_whole_model_compile_fails_for_real(main):
    run, m, runs = main
    whole = runs["fsdp2 raf=default compile=model-before fullgraph"]
    assert whole["history"] == [] and whole["compile_error"].startswith("Unsupported")
    # FSDP's hook, dynamo-disabled
    assert any("_fsdp_common.py" in f for f in whole["compile_trace"])
    assert any("_call_impl" in f for f in whole["compile_trace"])
    # DCP loaded it
    assert all(r["name"].startswith("_orig_mod.") and r["full_equal"] for r in whole["dtensor"])
    assert (
        "_orig_mod.tok_emb.weight" in whole["export"]
        and "missing keys (tok_emb.weight" in whole["export"]
    )
    assert runs["fsdp2 raf=default"]["export"] == "ok"
    # A whole-model compile wraps the root only: the blocks stay Blocks (FSDP's subclass of them).
    assert whole["classes"] == ["FSDPOptimizedModule", "FSDPBlock"]
    assert runs["fsdp2 raf=default"]["classes"] == ["FSDPGPT", "FSDPBlock"]


@pytest.mark.slow
def test_compile_orders(main):
    """The notebook's optional launch: every compiled variant trains to the eager losses."""
    _, _, runs = notebook_launch(COMPILE)
    eager = runs["fsdp2 raf=default"]
    for label in [
        "fsdp2 raf=default compile=blocks fullgraph",
        "fsdp2 raf=default compile=model-before",
        "fsdp2 raf=default compile=model-after",
    ]:
        run = runs[label]
        assert run["problems"] == [] and len(run["history"]) == 3, label
        assert max(abs(a - b) for a, b in zip(losses(run), losses(eager))) < 1e-4, label
        assert run["compiled"]["unique_graphs"] == 1 and run["compiled"]["graph_breaks"] == 0, label
        assert run["first_step_ms"] > 2 * run["ms_per_step"], label  # compilation on step 0
        assert run["fsdp_units"] == 5
    blocks = runs["fsdp2 raf=default compile=blocks fullgraph"]
    assert blocks["export"] == "ok" and blocks["dtensor"][0]["name"] == "tok_emb.weight"
    ops = {runs[k]["compiled"]["ops_captured"] for k in runs if "compile=" in k}
    assert len(ops) == 1  # the whole-model wrappers capture what per-block compile captures
    assert all("_orig_mod." in runs[k]["export"] for k in runs if "compile=model" in k)


def _solution():
    spec = importlib.util.spec_from_file_location(
        "sol", REPO_ROOT / "solutions" / "lesson5_shard.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.shard


@pytest.mark.slow
def test_exercise_solution_passes(main):
    _, m, runs = main
    passed, message = check_shard(_solution(), main=m)
    assert passed, message
    rows = runs["fsdp2 raf=default"]["dtensor"]
    # one block less
    assert (
        goal_all_gather_bytes(rows, 4, 2)
        == runs["fsdp2 raf=default"]["collectives"]["all_gather"]["bytes"]
        - sum(theory.fsdp2.padded_numel(s, 2) for s in unit_shapes(rows)[4]) * 4
    )


def _fake_main(gathered=1000):
    history = [{"loss": 3.0}, {"loss": 2.5}]
    config = {"steps": 2, "log_every": 2, "batch_size": 8, "lr": 3e-3, "seed": 0, "n_layers": 2}
    return {
        "world_size": 2,
        "results": {
            "runs": [
                {
                    "label": "classic raf=default",
                    "fsdp_units": 3,
                    "history": history,
                    "config": config,
                    "collectives": {"all_gather": {"bytes": 1}},
                },
                {
                    "label": "fsdp2 raf=default",
                    "history": history,
                    "config": config,
                    "memory": {"gathered": gathered},
                },
            ]
        },
    }


def _fake_run(units=3, all_gather=None, gathered=1000):
    rows = [
        {"name": n, "global": [4, 2], "placements": "S(0)", "local": [[2, 2], [2, 2]]}
        for n in ("emb.weight", "blocks.0.w", "blocks.1.w")
    ]

    def run(lesson, *args, **kwargs):
        bytes_ = goal_all_gather_bytes(rows, 2, 2) if all_gather is None else all_gather
        return {
            "world_size": 2,
            "results": {
                "runs": [
                    {
                        "fsdp_units": units,
                        "dtensor": rows,
                        "history": [{"loss": 3.0}, {"loss": 2.5}],
                        "collectives": {"all_gather": {"bytes": bytes_}},
                        "memory": {"gathered": gathered},
                    }
                ]
            },
        }

    return run


def shard(model, mesh):  # an attempt (the checker runs it through the fake launcher)
    return None


def test_checker_explains_without_giving_the_answer():
    passed, message = check_shard(shard, main=_fake_main(), run=_fake_run(units=1))
    assert not passed and "1 FSDP units" in message
    passed, message = check_shard(shard, main=_fake_main(), run=_fake_run(all_gather=10**6))
    assert not passed and "the goal is" in message
    assert "reshard_after_forward" not in message and "last" not in message  # no answer in it
    passed, message = check_shard(shard, main=_fake_main(gathered=10), run=_fake_run(gathered=20))
    assert not passed and "held up to 20 B" in message
    passed, message = check_shard(shard, main=_fake_main(), run=_fake_run())
    assert passed, message


def test_untouched_exercise_is_not_attempted(repo_root, tmp_path):
    notebook = json.loads((repo_root / "lessons/05_fsdp2/05_fsdp2.ipynb").read_text())
    cell = next(
        c for c in notebook["cells"] if "exercise:lesson5_shard" in c["metadata"].get("tags", [])
    )
    text = "".join(cell["source"])
    starter = tmp_path / "starter.py"
    starter.write_text(text)
    spec = importlib.util.spec_from_file_location("starter", starter)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(NotImplementedError):
        check_shard(module.shard, main=_fake_main(), run=_fake_run())
    # the starter gives nothing away
    assert "reshard_after_forward" not in text and "blocks" not in text


def test_bad_variant_is_one_line(run_launcher):
    """Every rank refuses the variant alike, before any model is built: one rank shows the line
    and the exit code."""
    r = run_launcher(
        "lesson5.sh", "--variants", "reshard-after-forward=maybe", env={"NPROC": 1}, timeout=120
    )
    assert r.returncode == 2
    assert "reshard-after-forward=maybe" in r.stderr and "Traceback" not in r.stderr


def test_parsers_and_theory():
    assert RUNS.parse_reshard("default") is None and RUNS.parse_reshard("false") is False
    assert RUNS.parse_reshard("true") is True and RUNS.parse_reshard("2") == 2
    with pytest.raises(argparse.ArgumentTypeError, match="a group size >= 1, not 'maybe'"):
        RUNS.parse_reshard("maybe")
    assert [theory.fsdp2.local_rows(27, 2, r) for r in range(2)] == [14, 13]
    assert [theory.fsdp2.local_rows(5, 4, r) for r in range(4)] == [2, 2, 1, 0]
    assert (
        theory.fsdp2.stored_rows(5, 4) == 2 and theory.fsdp2.padded_numel([27, 128], 2) == 28 * 128
    )
    assert theory.fsdp2.reshard_per_group(None, 3, 4) == [False, True, True]
    assert theory.fsdp2.reshard_per_group(1, 2, 4) == [False, False]
    assert theory.fsdp2.reshard_per_group([4, 2], 2, 4) == [True, 2]
    groups = [[[2]], [[4]]]
    assert (
        theory.fsdp2.collective_bytes_theory(groups, 2, [False, True])["all_gather"]
        == (2 + 4 + 4) * 4
    )
    assert theory.fsdp2.collective_bytes_theory(
        groups, 2, None
    ) == theory.fsdp2.collective_bytes_theory(groups, 2, True)
    assert math.isclose(theory.fsdp2.state_bytes_theory([[4, 2]], 2)["optimizer"], 2 * 4 * 4)
