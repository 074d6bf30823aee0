"""Lesson 6 (the silent bugs) under torchrun on CPU ranks: each bug differs from the single-process
reference by more than a stated amount, each fix matches it; BatchNorm statistics, the all-reduce
BatchNorm, mixed-precision dtypes, bytes and reduce error against theory; the exercise.

The launches are the notebook's, declared once in lessons/06_silent_bugs/launches.toml, so a test
run starts each of them once: the main launch (2 ranks), the 4-rank launch (part A's bug and two
fixes, part C's reduce error) and the exercise's check of the solution. Only the tests start one
more: a bad flag, on 1 rank. The other bad flag and --help go through the script's own parser in
this process.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from course_lab.exercises.lesson6 import MYSTERY, check_find_the_bug
from course_lab.notebook import launch_lesson
from fsdp_course.config import parse_config
from fsdp_course.theory import precision as theory
from helpers import lesson_script

# The notebook's launches (lessons/06_silent_bugs/06_silent_bugs.ipynb).
LESSON = MYSTERY.parent  # the exercise's loops import the lesson's nets.py
SHAPES = [[192, 32], [192], [192, 192], [192], [1, 192], [1]]  # RotaryRegressor's parameters

FIX_TOLERANCE = 1e-4  # fp32 fixes vs the reference, after 6 AdamW steps (measured ~1e-5)
BUG_MINIMUM = 0.05  # the bugs are off by more than this (measured 0.1 and more)


def ok(run):
    assert run.returncode == 0, run.stdout[-3000:]
    return run.metrics["results"]


@pytest.fixture(scope="module")
def main_run():
    run = launch_lesson(6, "all_parts")  # lessons/06_silent_bugs/launches.toml
    return ok(run), run.stdout


@pytest.fixture(scope="module")
def run_n4():
    return ok(launch_lesson(6, "four_ranks"))


def by(runs: list[dict], key: str) -> dict:
    return {r[key]: r for r in runs}


@pytest.mark.slow
def test_init_bug_differs_and_every_fix_matches(main_run):
    results, out = main_run
    runs = by(results["init"]["runs"], "variant")
    bug = runs["per-rank-seed"]
    assert (
        bug["init_diff"] > BUG_MINIMUM
        and bug["final_diff"] > BUG_MINIMUM
        and bug["loss_diff"] > 1e-3
    )
    # The detector sees the bug before wrapping, and nothing after (all-gathered = identical).
    assert len(bug["before_wrap"]["differ"]) == 11 and bug["after_wrap"]["differ"] == []
    # 2 float64 per tensor per rank
    assert bug["before_wrap"]["bytes"] == 2 * 16 * bug["before_wrap"]["checked"]
    sources = {run["from"] for row in bug["origins"] for run in row["runs"]}
    assert sources == {"rank 0", "rank 1", "all"}, sources  # the gathered model mixes both inits
    split = [
        row["name"]
        for row in bug["origins"]
        if len({r["from"] for r in row["runs"]} - {"all"}) == 2
    ]
    assert split, "some parameter is cut between the ranks' inits"
    for name in ("ddp", "same-seed", "broadcast", "sync-module-states", "load-rank0"):
        fix = runs[name]
        assert fix["init_diff"] == 0, name
        assert fix["final_diff"] < FIX_TOLERANCE and fix["loss_diff"] < 1e-5, name
    assert (
        runs["ddp"]["after_ddp"]["differ"] == [] and len(runs["ddp"]["before_wrap"]["differ"]) == 11
    )
    assert runs["same-seed"]["before_wrap"]["differ"] == []
    assert runs["sync-module-states"]["error"].startswith(
        "ValueError: The module has CPU parameters or buffers when `sync_module_states=True`"
    )
    meta = runs["fsdp2-meta"]
    assert meta["init_diff"] > BUG_MINIMUM and meta["final_diff"] > BUG_MINIMUM
    # On CPU ranks each shard is drawn from the rank's own generator: only rank 0's rows of the
    # first parameter drawn coincide with the single-process init.
    equal = meta["equal_to_reference"]
    assert equal["equal"] < 0.02 * equal["elements"] and list(equal["tensors"]) == [
        "tok_emb.weight"
    ]
    assert "A. initialisation" in out


@pytest.mark.slow
def test_uneven_init_on_four_ranks(run_n4):
    """On 4 ranks the cuts are uneven: the root unit's flat parameter (the parameters outside
    the blocks) does not split in 4 equal pieces, and the 27-row tensors of FSDP2's load-rank0
    are sharded 7, 7, 7, 6."""
    runs = by(run_n4["init"]["runs"], "variant")
    origins = runs["per-rank-seed"]["origins"]
    assert sum(row["numel"] for row in origins if not row["name"].startswith("blocks.")) % 4 != 0
    assert any(row["name"] == "head.weight" and row["numel"] == 27 * 64 for row in origins)
    sources = {run["from"] for row in origins for run in row["runs"]}
    assert {"rank 0", "rank 1", "rank 2", "rank 3"} <= sources
    assert runs["per-rank-seed"]["final_diff"] > BUG_MINIMUM
    assert runs["broadcast"]["init_diff"] == 0 and runs["broadcast"]["final_diff"] < FIX_TOLERANCE
    assert runs["load-rank0"]["init_diff"] == 0 and runs["load-rank0"]["final_diff"] < FIX_TOLERANCE


@pytest.mark.slow
def test_batchnorm_stats_differ_and_the_fixes_match(main_run):
    results, _ = main_run
    bn = results["batchnorm"]
    runs = by(bn["runs"], "variant")
    plain = runs["batchnorm"]
    assert plain["stats_across_ranks"] > 0.1 and plain["stats_vs_global"] > 0.1
    assert plain["grad_rel_error"] > 0.1 and plain["output_diff"] > 0.1
    ddp = runs["ddp"]  # rank 0's buffers broadcast before each forward: closer, still not global
    assert (
        0 < ddp["stats_across_ranks"] < plain["stats_across_ranks"] and ddp["stats_vs_global"] > 0.1
    )
    assert ddp["grad_rel_error"] == pytest.approx(plain["grad_rel_error"], rel=1e-4)
    fixed = runs["allreduce-bn"]
    assert fixed["stats_across_ranks"] == 0 and fixed["stats_vs_global"] < 1e-5
    assert (
        fixed["grad_rel_error"] < 1e-5 and fixed["output_diff"] < 1e-5 and fixed["loss_diff"] < 1e-5
    )
    for name in ("layernorm", "groupnorm"):
        assert runs[name]["grad_rel_error"] < 1e-5 and "stats_across_ranks" not in runs[name]
    assert "SyncBatchNorm expected input tensor to be on GPU" in runs["syncbn"]["error"]


@pytest.mark.slow
def test_batchnorm_error_shrinks_with_the_per_rank_batch(main_run):
    results, _ = main_run
    sweep = results["batchnorm"]["sweep"]
    plain = [r["grad_rel_error"] for r in sweep if r["variant"] == "batchnorm"]
    assert [r["batch_per_rank"] for r in sweep if r["variant"] == "batchnorm"] == [2, 4, 8, 16, 32]
    assert plain[0] > 3 * plain[-1] and min(plain) > 0.1
    assert all(r["grad_rel_error"] < 1e-5 for r in sweep if r["variant"] == "allreduce-bn")


@pytest.mark.slow
def test_batchnorm_buffers_and_classic_mixed_precision(main_run):
    results, _ = main_run
    rows = by(by(results["batchnorm"]["runs"], "variant")["batchnorm"]["layout"], "name")
    assert rows["layers.0.0.weight"]["class"] == "DTensor" and rows["layers.0.0.weight"][
        "local shape"
    ] == [64, 32]
    for name in ("layers.0.1.running_mean", "layers.0.1.running_var"):
        assert rows[name]["class"] == "Tensor" and rows[name]["local shape"] == [128]  # not sharded
    mp = {
        (r["auto_wrap_policy"], r["buffer_dtype"], r["module"]): r
        for r in results["batchnorm"]["classic_mixed_precision"]
    }
    bn = mp[("ModuleWrapPolicy", "bfloat16", "layers.0.1")]
    assert bn["weight dtype in forward"] == "float32" and bn["running_mean"] == "float32"
    assert (
        mp[("ModuleWrapPolicy", "bfloat16", "layers.0.0")]["weight dtype in forward"] == "bfloat16"
    )
    assert "auto_wrap_policy" in bn["warning"]
    # The input reaches the ignored BatchNorm in bf16; FSDP's own pre-hook casts it to fp32 for it.
    assert (bn["input as it arrives"], bn["input it computes with"]) == ("bfloat16", "float32")
    # Without an auto-wrap policy _module_classes_to_ignore does nothing: BatchNorm runs in bf16,
    # its running statistics in bf16 only when buffer_dtype says so; left fp32, BatchNorm refuses.
    for buffers in ("bfloat16", "None"):
        bn = mp[("none", buffers, "layers.0.1")]
        assert (
            bn["weight dtype in forward"] == "bfloat16"
            and bn["input it computes with"] == "bfloat16"
        )
        assert bn["running_mean"] == ("bfloat16" if buffers == "bfloat16" else "float32")
    assert mp[("none", "bfloat16", "layers.0.1")]["error"] == ""
    assert mp[("none", "None", "layers.0.1")]["error"].startswith(
        "RuntimeError: expected scalar type"
    )


@pytest.mark.slow
def test_precision_dtypes_bytes_and_errors(main_run):
    results, out = main_run
    runs = by(results["precision"]["runs"], "label")
    assert runs["fsdp2:fp32/fp32"]["grad_rel_error"] < 1e-6
    u = theory.unit_roundoff(torch.bfloat16)
    assert 0.1 * u < runs["fsdp2:fp32/bf16"]["grad_rel_error"] < u  # the reduce alone
    assert runs["fsdp2:bf16/fp32"]["grad_rel_error"] > runs["fsdp2:fp32/bf16"]["grad_rel_error"]
    for label, run in runs.items():
        if "error" in run:
            continue
        spec = label.split(":")[1].split("+")[0].split("/")
        dtypes = [theory_dtype(s) for s in spec]
        api = label.split(":")[0]
        expected = theory.collective_bytes(SHAPES, 2, dtypes[0], dtypes[1], api)
        # a non-root unit is gathered again in backward
        gathers = 2 if label.endswith("+unit") else 1
        assert run["collectives"]["all_gather"]["bytes"] == gathers * expected["all_gather"], label
        assert run["collectives"]["reduce_scatter"]["bytes"] == expected["reduce_scatter"], label
        assert run["gathered_bytes"] == theory.gathered_bytes(SHAPES, dtypes[0]), label
        assert run["dtypes"]["gathered params"] == str(dtypes[0]).replace("torch.", ""), label
        assert run["dtypes"]["reduce"] == str(dtypes[1]).replace("torch.", ""), label
        assert run["dtypes"]["sharded params"] == run["dtypes"]["optimizer state"] == "float32", (
            label
        )
    # FSDP2 leaves buffers alone; classic MixedPrecision(buffer_dtype=bf16) casts them.
    assert runs["fsdp2:bf16/fp32"]["dtypes"]["buffer"] == "float32"
    assert runs["classic:bf16/fp32/bf16"]["dtypes"]["buffer"] == "bfloat16"
    assert "C. mixed precision" in out and "dtypes, read from the tensors" in out


def theory_dtype(name: str) -> torch.dtype:
    return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


@pytest.mark.slow
def test_precision_pitfalls(main_run):
    results, _ = main_run
    runs = by(results["precision"]["runs"], "label")
    assert "mat1 and mat2 must have the same dtype" in runs["fsdp2:bf16/fp32+nocast"]["error"]
    fixed = runs["fsdp2:bf16/fp32+nocast+unit"]
    assert "error" not in fixed and fixed["grad_rel_error"] == pytest.approx(
        runs["fsdp2:bf16/fp32"]["grad_rel_error"]
    )
    # bf16 buffer: the angles position * inv_freq are off by radians, the model by far more.
    buffer_bug, buffer_ok = runs["classic:bf16/fp32/bf16"], runs["classic:bf16/fp32/fp32"]
    assert buffer_bug["angle_error"] > 1 and buffer_ok["angle_error"] < 1e-3
    assert (
        buffer_bug["loss_diff"] > 10 * buffer_ok["loss_diff"] and buffer_bug["grad_rel_error"] > 0.1
    )
    # fp16: without a scaler small gradients flush to zero; the scaler keeps them, and when its
    # scale grows too far a step overflows, is skipped, and the scale halves.
    no_scaler, scaler = runs["classic:fp16/fp16/fp32"], runs["classic:fp16/fp16/fp32+scaler"]
    assert no_scaler["grad_zeros"] > scaler["grad_zeros"]
    for run in (scaler, runs["fsdp2:fp16/fp16+scaler"]):
        assert run["skipped"] >= 1 and max(run["scales"]) == 2**17 and min(run["scales"]) == 2**16


@pytest.mark.slow
def test_bf16_reduce_error_grows_with_ranks(main_run, run_n4):
    results, _ = main_run
    n2 = by(results["precision"]["runs"], "label")
    n4 = by(run_n4["precision"]["runs"], "label")
    assert n4["fsdp2:fp32/fp32"]["grad_rel_error"] < 1e-6
    assert n4["fsdp2:fp32/bf16"]["grad_rel_error"] > n2["fsdp2:fp32/bf16"]["grad_rel_error"]
    assert (
        n4["fsdp2:fp32/bf16"]["collectives"]["reduce_scatter"]["bytes"]
        == theory.collective_bytes(SHAPES, 4, torch.float32, torch.bfloat16)["reduce_scatter"]
    )


@pytest.mark.slow
def test_exercise_mystery_differs_and_solution_passes(main_run, repo_root, monkeypatch):
    results, _ = main_run
    monkeypatch.syspath_prepend(str(LESSON))
    assert (
        results["exercise"]["param_diff"] > BUG_MINIMUM
        and not results["exercise"]["matches_reference"]
    )
    spec = importlib.util.spec_from_file_location(
        "solution", repo_root / "solutions" / "lesson6_find_the_bug.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    passed, message = check_find_the_bug(module.train)
    assert passed, message
    assert "0 of 8 unsharded tensors differ" in message


def test_untouched_loop_is_not_attempted_and_a_wrong_fix_is_explained(monkeypatch):
    monkeypatch.syspath_prepend(str(LESSON))
    spec = importlib.util.spec_from_file_location("mystery", MYSTERY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(NotImplementedError):
        check_find_the_bug(module.train)

    def fake_run(lesson, *args, **kwargs):  # what the script reports for a loop still wrong
        return {
            "world_size": 2,
            "results": {
                "exercise": {
                    "param_diff": 0.35,
                    "steps": 6,
                    "tolerance": 1e-4,
                    "matches_reference": False,
                    "findings": [{"where": "before", "differ": ["head.weight"], "checked": 8}],
                }
            },
        }

    passed, message = check_find_the_bug(wrong_fix, run=fake_run)
    assert not passed and "differs from one process on the global batch by up to 0.35" in message
    assert "inspect('before'): 1 of 8 unsharded tensors differ" in message


def wrong_fix(env, batches, steps, seed, inspect):  # a "fix" that is not the starter
    return None


def test_help_lists_the_variants(capsys):
    """train.py --help through the script's own parser (the launcher runs --help on one rank:
    tests/test_launch.py)."""
    train = lesson_script(6)
    with pytest.raises(SystemExit) as exited:
        parse_config(train.Config, train.__doc__, argv=["--help"])
    assert exited.value.code == 0
    shown = capsys.readouterr().out
    for variant in (
        "per-rank-seed",
        "sync-module-states",
        "fsdp2-meta",
        "load-rank0",
        "allreduce-bn",
        "syncbn",
        "groupnorm",
        "API:PARAM/REDUCE",
        "scaler",
        "nocast",
    ):
        assert variant in shown, variant


BAD_FLAGS = [
    (
        ("--parts", "init,nonsense"),
        "argument --parts: 'nonsense': choose from init, batchnorm, precision, exercise",
    ),
    (
        ("--precision", "fsdp2:bf17/fp32"),
        "argument --precision: fsdp2:bf17/fp32: expected API:PARAM/REDUCE",
    ),
]


@pytest.mark.parametrize("flags, said", BAD_FLAGS)
def test_bad_flags_are_refused_with_one_line(capsys, flags, said):
    """What train.py does with its flags first (parse_config), in this process; the next test
    shows the same through torchrun."""
    train = lesson_script(6)
    with pytest.raises(SystemExit) as exited:
        parse_config(train.Config, train.__doc__, argv=list(flags))
    assert exited.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
    assert len(errors) == 1 and said in errors[0], errors


@pytest.mark.slow
def test_a_bad_flag_under_torchrun_is_one_line(run_launcher):
    flags, said = BAD_FLAGS[1]  # the lesson's own parser (runs.Specs)
    r = run_launcher("lesson6.sh", *flags, env={"NPROC": "1"}, timeout=120)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    said_by_rank0 = [line for line in r.stderr.splitlines() if line.startswith("train.py: error:")]
    assert len(said_by_rank0) == 1 and said in said_by_rank0[0], r.stderr[-2000:]


def test_precision_theory():
    assert (
        theory.significand_bits(torch.bfloat16) == 8
        and theory.significand_bits(torch.float16) == 11
    )
    assert (
        theory.exact_integer_limit(torch.bfloat16) == 256
        and theory.exact_integer_limit(torch.float16) == 2048
    )
    assert theory.max_rounding_error(4000, torch.bfloat16) == 8
    assert (
        torch.tensor(257.0, dtype=torch.bfloat16).item() != 257
        and torch.tensor(256.0, dtype=torch.bfloat16).item() == 256
    )
    assert (
        torch.tensor(theory.smallest_subnormal(torch.float16) / 2, dtype=torch.float16).item() == 0
    )
    assert torch.tensor(theory.smallest_subnormal(torch.float16), dtype=torch.float16).item() > 0
    assert theory.collective_bytes([[3, 2]], 2, torch.bfloat16, torch.float32) == {
        "all_gather": 16,
        "reduce_scatter": 32,
    }
    assert theory.collective_bytes([[3, 2]], 4, torch.float32, torch.float32, "classic") == {
        "all_gather": 32,
        "reduce_scatter": 32,
    }


def test_allreduce_batchnorm_converts_and_keeps_state():
    norms = lesson_script(6, "allreduce_batchnorm")  # as the lesson's scripts import it
    AllReduceBatchNorm, convert_allreduce_batchnorm = (
        norms.AllReduceBatchNorm,
        norms.convert_allreduce_batchnorm,
    )

    bn = torch.nn.BatchNorm1d(4)
    bn.running_mean.fill_(1.5)
    model = convert_allreduce_batchnorm(torch.nn.Sequential(torch.nn.Linear(3, 4), bn))
    assert isinstance(model[1], AllReduceBatchNorm) and torch.equal(
        model[1].running_mean, bn.running_mean
    )
    x = torch.randn(5, 4)
    model[1].eval()
    bn.eval()
    assert torch.equal(model[1](x), bn(x))  # outside training (or one process): plain BatchNorm


def test_notebook_exercise_cell_is_the_mystery_loop(repo_root):
    """The checker tells 'not attempted' by comparing the cell with mystery_loop.py, so the two
    must stay equal."""
    import nbformat

    nb = nbformat.read(
        repo_root / "lessons" / "06_silent_bugs" / "06_silent_bugs.ipynb", as_version=4
    )
    cells = [
        c
        for c in nb.cells
        if "exercise:lesson6_find_the_bug" in c.get("metadata", {}).get("tags", [])
    ]
    assert len(cells) == 1 and cells[0].source.strip() == MYSTERY.read_text().strip()
