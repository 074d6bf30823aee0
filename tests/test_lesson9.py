"""Lesson 9 (your model) under torchrun on CPU ranks: a transformers Llama built from config and
sharded with fully_shard (blocks found from _no_split_modules), trained until its loss falls, its
state bytes equal to the planner's for the same config.json; DCP resume bitwise; both Hugging
Face exports loaded by from_pretrained in this (plain) process with the sharded model's logits;
the way in; DeepSpeed ZeRO-1/2/3 beside FSDP2 and classic FSDP (losses, bytes per rank by
category, collectives, DeepSpeed's defaults); the exercise's checker; bad flags.

The main launch is the notebook's own (lessons/09_your_model/launches.toml): within one test run
the notebook's test and these share it (tests/run_cache.py); so is the exercise's launch."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json

import pytest
import torch

from course_lab.exercises.lesson9 import check_shard, launch_args
from fsdp_course import plan
from helpers import REPO_ROOT, lesson_script
from lesson_runs import launch, ok

RUN = REPO_ROOT / "runs" / "lesson9" / "notebook"  # the notebook's folder: the same launch


@pytest.fixture(scope="module")
def main():
    run, metrics = launch(9, "main", out=RUN)  # lessons/09_your_model/launches.toml
    ok(run)
    return run, metrics


def test_notebook_uses_this_launch(repo_root):
    text = json.loads((repo_root / "lessons/09_your_model/09_your_model.ipynb").read_text())
    source = "".join(
        "".join(cell["source"]) for cell in text["cells"] if cell["cell_type"] == "code"
    )
    assert 'RUN = REPO / "runs" / "lesson9" / "notebook"' in source
    assert 'run_lesson(9, "main", out=RUN)' in source
    assert "configs/llama3-8b.json" in source


@pytest.mark.slow
def test_a_model_it_did_not_write_is_sharded_and_learns(main):
    run, m = main
    r = m["results"]
    train = r["train"]
    assert r["class"] == "LlamaForCausalLM" and r["no_split_modules"] == ["LlamaDecoderLayer"]
    assert r["num_params"] == 803_968  # the quiz's q_param_bytes: 803,968 x 4 / 2
    assert train["num_blocks"] == train["block_units"] == 4
    assert train["fsdp_units"][0] == "" and len(train["fsdp_units"]) == 5
    assert all(
        u.endswith("_checkpoint_wrapped_module") for u in train["fsdp_units"][1:]
    )  # AC first
    assert (
        train["placements"] == ["(Shard(dim=0),)"]
        and train["dtensor_params"] == train["num_tensors"] == 39
    )
    assert train["local_param_bytes"] * 2 == train["full_param_bytes"] == 4 * r["num_params"]
    assert train["garbage_buffers"] == 2  # rotary inv_freq and original_inv_freq after to_empty
    losses = [h["loss"] for h in train["history"]]
    assert len(losses) == m["config"]["steps"] and losses[0] > 5.0 and losses[-1] < losses[0] - 1.0
    assert "LlamaDecoderLayer" in run.stdout and "Traceback" not in run.stdout


@pytest.mark.slow
def test_state_bytes_equal_the_planners_for_the_same_config(main):
    _, m = main
    argv = [
        "--hf-config",
        str(RUN / "hf_full"),
        "--world-size",
        "2",
        "--precision",
        "bf16-mixed",
        "--activation-checkpointing",
        "full",
        "--batch",
        str(m["config"]["batch_size"]),
        "--seq",
        str(m["config"]["seq_len"]),
        "--json",
    ]
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert plan.main(argv) == 0
    planned, measured = json.loads(out.getvalue()), m["results"]["train"]["memory"]
    assert planned["num_params"] == m["results"]["num_params"]
    for key in ("params", "grads", "optimizer"):
        assert planned["categories"][key] == measured[key], key
    assert 0.5 < measured["peak"] / planned["peak"] < 2  # the peaks: estimates of the same step


@pytest.mark.slow
def test_dcp_resume_is_bitwise_and_the_way_in_equals_from_pretrained(main):
    _, m = main
    ck = m["results"]["checkpoint"]
    assert ck["differs_before_load"] and ck["loaded"]["equal"] and ck["loaded"]["tensors"] == 39 * 4
    assert ck["next_losses"][0] == ck["next_losses"][1]
    assert {f["name"] for f in ck["dcp_files"]} >= {".metadata", "__0_0.distcp", "__1_0.distcp"}
    names = {f["name"] for f in ck["hf_dcp_files"]}
    assert {
        "config.json",
        "model-00001-of-00001.safetensors",
        "model.safetensors.index.json",
    } <= names
    assert sum(n.startswith("sharded/") for n in names) == 2  # one file per rank, then consolidated
    assert {"config.json", "model.safetensors"} <= {f["name"] for f in ck["hf_full_files"]}
    way_in = ck["way_in"]
    assert way_in["tensors_equal"] == way_in["tensors"] == 39 and way_in["logits_max_diff"] == 0.0


@pytest.mark.slow
def test_both_exports_load_in_a_plain_process_with_the_sharded_logits(main):
    """This test process has no process group: from_pretrained as a learner's script would."""
    from transformers import AutoModelForCausalLM

    _, m = main
    probe = torch.tensor(
        list(
            (REPO_ROOT / "lessons/09_your_model/corpus.txt").read_bytes()[: m["config"]["seq_len"]]
        )
    )
    sharded = torch.load(RUN / "logits.pt")
    for folder in ("hf_full", "hf_dcp"):
        bf16 = AutoModelForCausalLM.from_pretrained(RUN / folder, dtype=torch.bfloat16)
        fp32 = AutoModelForCausalLM.from_pretrained(RUN / folder)
        with torch.no_grad():
            assert torch.equal(bf16(probe[None]).logits.float(), sharded), (
                folder
            )  # it computed in bf16
            assert not torch.equal(fp32(probe[None]).logits.float(), sharded), (
                folder
            )  # the dtype matters


@pytest.mark.slow
def test_zero_beside_fsdp(main):
    run, m = main
    runs = {r["variant"]: r for r in m["results"]["compare"]["runs"]}
    base, P, n = runs["fsdp2"], m["results"]["num_params"], m["world_size"]
    for name in ("classic", "zero1", "zero2", "zero2-buckets"):  # the same model, to the bit
        assert runs[name]["losses"] == base["losses"] and runs[name]["final"] == base["final"], name
    assert max(abs(a - b) for a, b in zip(runs["zero3"]["losses"], base["losses"])) < 1e-5
    defaults = runs["zero3-defaults"]["losses"]
    assert defaults[0] == base["losses"][0] and defaults[1] != base["losses"][1]  # clipping at 1.0
    for name, r in runs.items():
        mem = r["memory"]
        assert mem["grads"] == mem["master"] or mem["master"] == 0, name
        assert mem["optimizer"] == 8 * P // n and mem["grads"] == 4 * P // n, name
        if name.startswith("zero"):
            assert mem["master"] == 4 * P // n, name  # a separate fp32 copy, even in fp32
        else:
            assert mem["master"] == 0 and mem["params"] == 4 * P // n, name
    assert runs["zero1"]["memory"]["params"] == runs["zero2"]["memory"]["params"] == 4 * P  # whole
    assert (
        runs["zero3"]["memory"]["params"] == 4 * P // n
        and runs["zero3"]["memory"]["persistent_params"] == 0
    )
    persist = runs["zero3-defaults"]["memory"]
    assert persist["persistent_params"] == 39 and persist["params"] == 4 * P + 4 * P // n
    small, big = (
        runs["zero2-buckets"]["collectives"]["all_reduce"],
        runs["zero2"]["collectives"]["all_reduce"],
    )
    assert small["calls"] > 2 * big["calls"] and small["bytes"] == big["bytes"]
    ds = m["results"]["compare"]["deepspeed"]
    assert ds["version"] == "0.19.8" and ds["defaults"]["gradient_clipping"] == 1.0
    assert (
        runs["zero3"]["config"]["gradient_clipping"] == 0.0
        and runs["zero3-defaults"]["config"].get("gradient_clipping") is None
    )
    assert (
        "built successfully" not in run.stdout and "Building extension" not in run.stdout
    )  # no shm build


def _solution():
    spec = importlib.util.spec_from_file_location(
        "sol", REPO_ROOT / "solutions" / "lesson9_shard.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.shard


@pytest.mark.slow
def test_exercise_solution_passes(main):
    _, m = main
    passed, message = check_shard(_solution(), main=m)
    assert passed, message
    assert "Qwen2ForCausalLM" in message and "Qwen2DecoderLayer" in message


def _fake_main():
    return {"world_size": 2, "config": {"seed": 0}}


def _fake_run(
    units=("", "model.layers.0", "model.layers.1"),
    block_units=2,
    sharded=5,
    share=0.5,
    losses=(3.0, 2.0),
):
    def run(lesson, *args, **kwargs):
        assert lesson == 9 and "--family" in args and "qwen2" in args
        return {
            "world_size": 2,
            "results": {
                "class": "Qwen2ForCausalLM",
                "num_params": 10,
                "block_classes": ["Qwen2DecoderLayer"],
                "train": {
                    "num_blocks": 2,
                    "fsdp_units": list(units),
                    "block_units": block_units,
                    "dtensor_params": sharded,
                    "num_tensors": 5,
                    "placements": ["(Shard(dim=0),)"],
                    "local_param_bytes": share * 100,
                    "full_param_bytes": 100,
                    "history": [{"loss": v} for v in losses],
                },
            },
        }

    return run


def shard(model, mesh):  # an attempt (the checker runs it through the fake launcher)
    return None


def test_checker_explains():
    passed, message = check_shard(
        shard, main=_fake_main(), run=_fake_run(units=("",), block_units=0)
    )
    assert not passed and "2 decoder layers" in message
    passed, message = check_shard(
        shard, main=_fake_main(), run=_fake_run(units=("model.layers.0", "model.layers.1"))
    )
    assert not passed and "root" in message
    passed, message = check_shard(shard, main=_fake_main(), run=_fake_run(sharded=3))
    assert not passed and "3 of 5 parameters" in message
    passed, message = check_shard(shard, main=_fake_main(), run=_fake_run(losses=(3.0, 3.5)))
    assert not passed and "did not fall" in message
    passed, message = check_shard(shard, main=_fake_main(), run=_fake_run())
    assert passed, message
    assert launch_args("F.py", _fake_main())[-2:] == ["--shard-module", "F.py"]


def test_untouched_exercise_is_not_attempted(repo_root, tmp_path):
    notebook = json.loads((repo_root / "lessons/09_your_model/09_your_model.ipynb").read_text())
    cell = next(
        c for c in notebook["cells"] if "exercise:lesson9_shard" in c["metadata"].get("tags", [])
    )
    starter = tmp_path / "starter.py"
    starter.write_text("".join(cell["source"]))
    spec = importlib.util.spec_from_file_location("starter", starter)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(NotImplementedError):
        check_shard(module.shard, main=_fake_main(), run=_fake_run())
    assert "_no_split_modules" not in "".join(cell["source"])  # the starter gives nothing away


def test_flags_parse_in_process():
    """Bad values are argparse's one line and exit 2; the real launch below shows it once."""
    train = lesson_script(9)
    cfg = train.parse_config(train.Config, argv=["--compare", "zero3,fsdp2", "--parts", "compare"])
    assert cfg.compare == ("zero3", "fsdp2") and cfg.parts == ("compare",)
    for bad in (
        ["--compare", "zero4"],
        ["--parts", "everything"],
        ["--compare-steps", "0"],
        ["--family", "gpt5"],
    ):
        with pytest.raises(SystemExit) as exc:
            train.parse_config(train.Config, argv=bad)
        assert exc.value.code == 2, bad


def test_bad_flag_is_one_line(run_launcher):
    r = run_launcher("lesson9.sh", "--compare", "zero4", env={"NPROC": 1}, timeout=120)
    assert r.returncode == 2 and "zero4" in r.stderr and "Traceback" not in r.stderr


def test_help_says_how_to_launch(capsys):
    """--help in-process (the launcher's --help runs the same parser on one rank)."""
    train = lesson_script(9)
    with pytest.raises(SystemExit) as exc:
        train.parse_config(train.Config, train.__doc__, argv=["--help"])
    out = capsys.readouterr().out
    assert exc.value.code == 0 and "bash launch/lesson9.sh" in out and "--hf-config" in out
    assert "configs/llama3-8b.json" in out  # the GPU command, as the notebook shows it


def test_configs_and_block_classes_in_process(tmp_path):
    """--hf-config reads a config.json of any name (or its folder); each family's blocks are
    found from _no_split_modules, also after fully_shard renames their class."""
    from fsdp_course.dist import CourseError

    hf = lesson_script(9, "hf_model")
    qwen = hf.read_config(str(REPO_ROOT / "lessons/09_your_model/configs/tiny-qwen2.json"))
    assert (
        type(qwen).__name__ == "Qwen2Config"
        and qwen.hidden_size == 128
        and qwen.tie_word_embeddings
    )
    model = hf.build(qwen, "meta")
    assert {c.__name__ for c in hf.block_classes(model)} == {"Qwen2DecoderLayer"}
    assert len(hf.blocks(model)) == qwen.num_hidden_layers
    renamed = type(
        "FSDPQwen2DecoderLayer", (type(hf.blocks(model)[0]),), {}
    )  # what fully_shard does
    hf.blocks(model)[0].__class__ = renamed
    assert len(hf.blocks(model)) == qwen.num_hidden_layers
    train = lesson_script(9)
    mistral = hf.config_for("mistral", train.Config(), 256)
    assert {c.__name__ for c in hf.block_classes(hf.build(mistral, "meta"))} == {
        "MistralDecoderLayer"
    }
    (tmp_path / "bad.json").write_text('{"model_type": "nonsense"}')
    for bad in (tmp_path / "bad.json", tmp_path):
        with pytest.raises(CourseError):
            hf.read_config(str(bad))
