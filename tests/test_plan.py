"""The memory planner (fsdp_course.theory.memory and python -m fsdp_course.plan): each formula
against the model it describes, the CLI's output and its one-line errors. The measured side
(planner vs PyTorch's trackers under torchrun) is in test_lesson7.py."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import shlex
import sys
from pathlib import Path

import pytest
import torch

from fsdp_course import plan as cli
from fsdp_course.measure import activation_bytes
from fsdp_course.model import GPT, Block, ModelConfig
from fsdp_course.theory import decoders, memory, wrapping
from fsdp_course.theory.sharding import fsdp_unit_numels, model_state_bytes

SMALL = memory.GPTShape(vocab=27, seq=64, hidden=128, layers=4, heads=4)
SEVEN_B = cli.MODELS["course-gpt-7b"]()
GIB = 2**30


def gpt(shape: memory.GPTShape) -> GPT:
    with torch.device("meta"):
        return GPT(ModelConfig(shape.vocab, shape.seq, shape.hidden, shape.layers, shape.heads))


@pytest.mark.parametrize("shape", [SMALL, memory.GPTShape(50, 96, 64, 3, 2), SEVEN_B])
def test_shape_matches_the_model(shape):
    model = gpt(shape)
    assert [tuple(p.shape) for p in model.parameters()] == shape.parameter_shapes()
    assert shape.unit_numels() == fsdp_unit_numels(model, Block)
    assert shape.num_params == sum(p.numel() for p in model.parameters())
    assert shape.buffer_bytes() == sum(b.numel() * b.element_size() for b in model.buffers())


@pytest.mark.parametrize("dtype,e", [(torch.float32, 4), (torch.bfloat16, 2)])
def test_block_activation_formula_counts_what_autograd_saves(dtype, e):
    torch.manual_seed(0)
    shape, batch = memory.GPTShape(27, 32, 64, 1, 4), 3
    block = Block(ModelConfig(27, 32, 64, 1, 4)).to(dtype)
    x = torch.randn(batch, 32, 64, dtype=dtype, requires_grad=True)
    with activation_bytes(block) as saved:
        block(x).sum().backward()
    assert saved["bytes"] == memory.block_activation_bytes(shape, batch, e)


def test_checkpointing_keeps_only_block_inputs():
    assert memory.checkpointed_blocks(5, "none") == []
    assert memory.checkpointed_blocks(5, "full") == [0, 1, 2, 3, 4]
    assert memory.checkpointed_blocks(5, "every-2") == [0, 2, 4]
    for bad in ("every-0", "every-x", "some", "every-"):
        with pytest.raises(ValueError, match="none, full or every-K"):
            memory.checkpointed_blocks(5, bad)
    full = memory.activation_bytes(SMALL, 8, 4, [0, 1, 2, 3])
    none = memory.activation_bytes(SMALL, 8, 4, [])
    per_block = memory.block_activation_bytes(SMALL, 8, 4) - memory.checkpointed_block_bytes(
        SMALL, 8, 4
    )
    assert none - full == 4 * per_block
    assert memory.recompute_time_fraction(SEVEN_B, SEVEN_B.layers) == pytest.approx(1 / 3, rel=0.05)
    assert memory.recompute_time_fraction(SEVEN_B, 0) == 0


def test_backward_walk_peaks_at_the_last_block_without_checkpointing():
    b = memory.backward_bytes(SMALL, 8, 4, [], grad_shard=10, grad_buffer=20)
    assert b["block"] == SMALL.layers - 1 and b["grads"] == 0
    # with every block checkpointed, each step down trades an input for a finished gradient shard
    big_shard = memory.checkpointed_block_bytes(SMALL, 8, 4) + 1
    b = memory.backward_bytes(SMALL, 8, 4, [0, 1, 2, 3], grad_shard=big_shard, grad_buffer=0)
    assert b["block"] == 0 and b["grads"] == 3 * big_shard


def test_sharded_state_reuses_lesson_1_and_5():
    for n in (1, 2, 3, 8):
        assert memory.sharded_state_bytes(SMALL, n, "FULL_SHARD", "classic") == model_state_bytes(
            SMALL.unit_numels(), n, "FULL_SHARD"
        )
    ddp = memory.sharded_state_bytes(SMALL, 8, "DDP", "fsdp2")
    assert ddp == {
        "params": 4 * SMALL.num_params,
        "grads": 4 * SMALL.num_params,
        "optimizer": 8 * SMALL.num_params,
    }
    fsdp2 = memory.sharded_state_bytes(SEVEN_B, 8, "FULL_SHARD", "fsdp2")
    assert sum(fsdp2.values()) == pytest.approx(16 * SEVEN_B.num_params / 8, rel=1e-3)
    sgd = memory.sharded_state_bytes(SMALL, 2, "FULL_SHARD", "classic", optimizer="sgd")
    assert sgd["optimizer"] == 0


def test_gathered_matches_lesson_2_and_the_strategies():
    e = 2
    classic = memory.gathered_bytes(SMALL, 4, "FULL_SHARD", "classic", e)
    assert (
        classic["backward"]
        == wrapping.gathered_peaks(SMALL.unit_numels(), 4, param_bytes=e)["backward"]
    )
    sgo = memory.gathered_bytes(SMALL, 4, "SHARD_GRAD_OP", "classic", e)
    assert (
        sgo["forward_end"]
        == sgo["backward"]
        == sum(4 * math.ceil(n / 4) * e for n in SMALL.unit_numels())
    )
    assert memory.gathered_bytes(SMALL, 4, "DDP", "fsdp2", e) == {"forward_end": 0, "backward": 0}
    assert memory.gathered_bytes(SMALL, 1, "FULL_SHARD", "classic", 4)["backward"] == 0


def test_optimizer_temporaries_foreach_and_for_loop():
    sizes = [4 * math.prod(s) for s in SMALL.parameter_shapes()]
    assert memory.optimizer_temp_bytes(SMALL, 1, "DDP", "fsdp2", foreach=True) == sum(sizes)
    loop = memory.optimizer_temp_bytes(SMALL, 1, "DDP", "fsdp2", foreach=False)
    assert loop == max(a + 2 * b for a, b in zip([0] + sizes, sizes))


def test_zero_stages():
    psi, n = 7e9, 8
    assert memory.zero_stage_bytes(psi, n, 0)["total"] == 16 * psi
    assert memory.zero_stage_bytes(psi, n, 1)["total"] == 4 * psi + 12 * psi / n
    assert memory.zero_stage_bytes(psi, n, 2)["total"] == 2 * psi + 14 * psi / n
    assert memory.zero_stage_bytes(psi, n, 3)["total"] == 16 * psi / n
    with pytest.raises(ValueError):
        memory.zero_stage_bytes(psi, n, 4)


def test_wire_bytes_full_shard_sends_half_again_as_much():
    fs = memory.wire_bytes(SEVEN_B, 8, "FULL_SHARD", "fsdp2", 4)
    sgo = memory.wire_bytes(SEVEN_B, 8, "SHARD_GRAD_OP", "fsdp2", 4)
    ddp = memory.wire_bytes(SEVEN_B, 8, "DDP", "fsdp2", 4)
    root = SEVEN_B.unit_numels()[0]  # stays gathered from forward to backward: gathered once
    assert fs == pytest.approx((3 * SEVEN_B.num_params - root) * 4 * 7 / 8, rel=1e-6)
    assert sgo == pytest.approx(ddp, rel=0.01) and fs / sgo == pytest.approx(1.5, rel=0.03)
    assert memory.wire_bytes(SEVEN_B, 1, "FULL_SHARD", "fsdp2", 4) == 0


def test_plan_peak_is_the_largest_moment_and_fits_with_the_allowance():
    p = memory.plan(SEVEN_B, 1, 8, precision="bf16-mixed", gpu_bytes=80 * GIB)
    assert p["peak"] == max(p["totals"].values()) == sum(p["at_peak"].values())
    assert p["peak_moment"] == "backward" and p["fits"]
    assert p["needed"] == p["peak"] + p["allowance"] and p["allowance"] == int(0.1 * p["peak"])
    tight = memory.plan(SEVEN_B, 1, 8, precision="bf16-mixed", gpu_bytes=p["peak"] * 1.05)
    assert not tight["fits"]  # the peak fits, the allowance does not
    reserved = memory.plan(SMALL, 8, 2, gpu_bytes=10 * GIB, reserve=memory.CPU_RANK_RESERVE)
    assert reserved["allowance"] == memory.CPU_RANK_RESERVE
    n = memory.smallest_world_size(SEVEN_B, 1, 16 * GIB, precision="bf16-mixed")
    assert memory.plan(SEVEN_B, 1, n, precision="bf16-mixed", gpu_bytes=16 * GIB)["fits"]
    assert not memory.plan(SEVEN_B, 1, n // 2, precision="bf16-mixed", gpu_bytes=16 * GIB)["fits"]


def test_scaled_shape_has_about_the_asked_parameters():
    for params in (1e9, 7e9, 7e10):
        assert memory.scaled_shape(params).num_params == pytest.approx(params, rel=0.05)


@pytest.mark.parametrize("given", [7.5e9, 1.5e9, 7e9, 123_456_789])
def test_a_parameter_count_is_planned_exactly(given):
    """--params N: the state counts N parameters, not the assumed GPT's (which rounds)."""
    shape = memory.model_for_params(given)
    assert shape.num_params == int(given) and memory.scaled_shape(given).num_params != int(given)
    assert sum(shape.unit_numels()) == int(given)  # what the wire bytes and classic units count
    for n, strategy, api in [
        (8, "FULL_SHARD", "fsdp2"),
        (3, "FULL_SHARD", "fsdp2"),
        (8, "DDP", "fsdp2"),
    ]:
        local = int(given) if strategy == "DDP" else math.ceil(int(given) / n)
        assert memory.sharded_state_bytes(shape, n, strategy, api) == {
            "params": 4 * local,
            "grads": 4 * local,
            "optimizer": 8 * local,
        }
        assert memory.optimizer_temp_bytes(shape, n, strategy, api, foreach=True) == 4 * local
    classic = memory.sharded_state_bytes(shape, 8, "FULL_SHARD", "classic")
    assert classic == model_state_bytes(shape.unit_numels(), 8, "FULL_SHARD")
    assert (
        0 <= classic["params"] - 4 * int(given) / 8 < 4 * len(shape.unit_numels())
    )  # each unit's padding


def test_calculator_and_planner_count_the_same_model_the_same(monkeypatch, repo_root):
    """Lesson 7's calculator starts at the planner's course-gpt-7b and plans it to the byte."""
    monkeypatch.syspath_prepend(str(repo_root / "lessons" / "07_memory"))
    import calculator

    ours = calculator.plan_for(**calculator.DEFAULTS)
    theirs = memory.plan(SEVEN_B, 1, 8, precision="bf16-mixed", gpu_bytes=80 * GIB)
    assert ours["num_params"] == SEVEN_B.num_params
    for key in ("categories", "totals", "peak", "wire_bytes", "fits"):
        assert ours[key] == theirs[key], key
    again = calculator.plan_for(**{**calculator.DEFAULTS, "params_b": 7.5})
    assert again["num_params"] == 7_500_000_000 == cli_json(["--params", "7.5e9"])["num_params"]


def test_plan_refuses_settings_that_mean_nothing():
    for kwargs, said in [
        ({"strategy": "FOO"}, "unknown strategy"),
        ({"api": "x"}, "unknown api"),
        ({"precision": "fp8"}, "unknown precision"),
        ({"strategy": "NO_SHARD", "api": "fsdp2"}, "FSDP2 has no NO_SHARD"),
    ]:
        with pytest.raises(ValueError, match=said):
            memory.plan(SMALL, 8, 2, **kwargs)
    with pytest.raises(ValueError, match="world size"):
        memory.plan(SMALL, 8, 0)


def run_cli(run_cmd, *args):
    return run_cmd([sys.executable, "-m", "fsdp_course.plan", *args], timeout=60)


def test_cli_starts_without_torch(run_cmd):
    """The planner's formulas need no torch: its command answers at once instead of after the
    seconds a torch import costs (only the course's own named models read the course's data)."""
    for args in (["--params", "7e9"], ["--hf-config", str(SAMPLES[0])]):
        probe = (
            "import sys; from fsdp_course import plan; "
            f"code = plan.main({args!r}); "
            "print('imported:', 'torch' in sys.modules, 'transformers' in sys.modules); "
            "sys.exit(code)"
        )
        r = run_cmd([sys.executable, "-c", probe], timeout=60)
        assert r.returncode == 0, r.stderr
        assert "needed" in r.stdout and r.stdout.splitlines()[-1] == "imported: False False", (
            r.stdout[-500:]
        )


def test_cli_help_and_report(run_cmd):
    r = run_cli(run_cmd, "--help")
    assert r.returncode == 0
    for flag in (
        "--params",
        "--world-size",
        "--strategy",
        "--precision",
        "--optimizer",
        "--layers",
        "--hidden",
        "--seq",
        "--batch",
        "--activation-checkpointing",
        "--gpu-gib",
        "--model",
        "--zero-stage",
        "--json",
        "--hf-config",
    ):
        assert flag in r.stdout
    r = run_cli(
        run_cmd,
        "--params",
        "7e9",
        "--world-size",
        "8",
        "--strategy",
        "FULL_SHARD",
        "--precision",
        "bf16-mixed",
        "--optimizer",
        "adamw",
        "--gpu-gib",
        "80",
        "--zero-stage",
        "3",
    )
    assert r.returncode == 0, r.stderr
    assert "verdict   fits on a GPU of 80 GiB" in r.stdout and "ZeRO stage 3" in r.stdout
    r = run_cli(
        run_cmd,
        "--model",
        "course-gpt-7b",
        "--world-size",
        "8",
        "--precision",
        "bf16-mixed",
        "--gpu-gib",
        "16",
    )
    assert "does NOT fit" in r.stdout and "on 32 ranks" in r.stdout


def cli_json(args: list[str]) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main([*args, "--json"]) == 0
    return json.loads(out.getvalue())


def test_cli_prints_the_given_count_and_the_state_in_gb_and_gib(run_cmd):
    r = run_cli(run_cmd, "--params", "7.5e9", "--world-size", "8", "--zero-stage", "3")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("model: 7,500,000,000 parameters (7.500B, as given"), lines[0]
    start = lines.index(next(line for line in lines if line.startswith("model state per rank")))
    assert lines[start].split()[-2:] == ["GB", "GiB"]
    state = {line.split()[0]: line.split()[1:] for line in lines[start + 1 : start + 5]}
    assert state["params"][:2] == ["3.750", f"{7.5e9 / 2 / GIB:.3f}"]  # 4 bytes x 7.5e9 / 8 ranks
    assert state["total"][:2] == ["15.000", f"{15e9 / GIB:.3f}"]
    assert "ZeRO stage 3 per rank (N_d = 8)" in r.stdout


def test_cli_json_is_the_library(run_cmd):
    r = run_cli(
        run_cmd, "--model", "course-gpt-default", "--world-size", "2", "--no-foreach", "--json"
    )
    data = json.loads(r.stdout)
    expected = memory.plan(cli.MODELS["course-gpt-default"](), 8, 2, foreach=False)
    assert data["peak"] == expected["peak"] and data["categories"] == expected["categories"]
    assert data["model"] == {"vocab": 27, "seq": 64, "hidden": 128, "layers": 4, "heads": 4}


@pytest.mark.parametrize(
    "args,said",
    [
        (["--params", "-5"], "must be > 0"),
        (["--params", "abc"], "not a number"),
        (["--params", "1e9", "--world-size", "0"], "must be > 0"),
        (["--params", "1e9", "--strategy", "FOO"], "unknown strategy"),
        (["--params", "1e9", "--activation-checkpointing", "every-0"], "every-K"),
        (["--model", "nope"], "invalid choice"),
        ([], "say which model"),
        (["--model", "course-gpt-7b", "--params", "1e9"], "not both"),
        (["--params", "1e9", "--layers", "2.5"], "not a number"),
        (["--params", "nan"], "must be > 0"),
    ],
)
def test_cli_bad_input_is_one_line_exit_2(capsys, args, said):
    """In this process (cli.main, as `python -m` runs it): the next test shows the real command."""
    try:
        code = cli.main(args)
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and said in err, err


def test_cli_bad_input_as_a_command(run_cmd):
    r = run_cli(run_cmd, "--params", "abc")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == "python -m fsdp_course.plan: error: argument --params: not a number: 'abc'\n"


# --- Hugging Face configs (--hf-config): the count against transformers, the activations
# against what autograd saves, one line for what the planner cannot read -----------------------

SMALL_LLAMA = {
    "model_type": "llama",
    "vocab_size": 101,
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}
HF_CONFIGS = {
    "llama-gqa": SMALL_LLAMA,
    "llama-biases-tied-head-dim": {
        **SMALL_LLAMA,
        "attention_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": True,
        "head_dim": 32,
    },
    "llama-no-kv-field": {k: v for k, v in SMALL_LLAMA.items() if k != "num_key_value_heads"},
    "mistral": {
        **SMALL_LLAMA,
        "model_type": "mistral",
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
    },
    "mistral-no-kv-field": {
        **{k: v for k, v in SMALL_LLAMA.items() if k != "num_key_value_heads"},
        "model_type": "mistral",
        "num_attention_heads": 8,
    },
    "qwen2-tied": {**SMALL_LLAMA, "model_type": "qwen2", "tie_word_embeddings": True},
    "qwen2-untied": {**SMALL_LLAMA, "model_type": "qwen2"},
    "gpt2-tiny": {
        "model_type": "gpt2",
        "vocab_size": 101,
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "n_positions": 64,
        "attn_pdrop": 0.0,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
    },
    "gpt2-untied-n-inner-tanh": {
        "model_type": "gpt2",
        "vocab_size": 101,
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "n_positions": 64,
        "n_inner": 96,
        "tie_word_embeddings": False,
        "activation_function": "gelu_pytorch_tanh",
        "attn_pdrop": 0.0,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
    },
}
SAMPLES = sorted(
    (Path(__file__).resolve().parents[1] / "lessons" / "09_your_model" / "configs").glob("*.json")
)


def hf_model(cfg: dict, device: str = "meta"):
    """The model transformers builds from this config (on the meta device: no memory)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        cfg["model_type"], **{k: v for k, v in cfg.items() if k != "model_type"}
    )
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize(
    "cfg",
    [*HF_CONFIGS.values(), *[json.loads(p.read_text()) for p in SAMPLES]],
    ids=[*HF_CONFIGS, *[p.stem for p in SAMPLES]],
)
def test_hf_config_counts_every_parameter_as_transformers_builds_it(cfg):
    shape = decoders.from_hf_config(cfg)
    model = hf_model(cfg)
    assert shape.num_params == sum(p.numel() for p in model.parameters())
    assert shape.parameter_shapes() == [tuple(p.shape) for p in model.parameters()]
    layers = model.base_model.layers if hasattr(model.base_model, "layers") else model.base_model.h
    assert shape.unit_numels()[1:] == [
        sum(p.numel() for p in layer.parameters()) for layer in layers
    ]
    assert shape.buffer_bytes() == sum(b.numel() * 4 for b in model.buffers())  # fp32 buffers


def test_the_sample_configs_and_their_counts():
    """The shipped configs (lesson 9's folder), counted without transformers: the numbers the
    report quotes; the test above checks each against transformers."""
    counts = {
        p.stem: decoders.from_hf_config(json.loads(p.read_text())).num_params for p in SAMPLES
    }
    assert counts["llama3-8b"] == 8_030_261_248 and counts["gpt2"] == 124_439_808
    assert {"tiny-llama", "tiny-qwen2"} <= set(counts)


@pytest.mark.parametrize(
    "name",
    [
        "llama-gqa",
        "llama-biases-tied-head-dim",
        "mistral",
        "qwen2-tied",
        "gpt2-tiny",
        "gpt2-untied-n-inner-tanh",
    ],
)
@pytest.mark.parametrize("dtype,e", [(torch.float32, 4), (torch.bfloat16, 2)])
def test_hf_activation_formulas_count_what_autograd_saves(name, dtype, e):
    """One forward and backward of the real model on CPU (sdpa, no padding mask, no dropout),
    with transformers' own loss: saved bytes of the layers and of the root, as the planner says."""
    torch.manual_seed(0)
    batch, seq = 3, 32
    saved = {}
    for layers in (1, 2):
        cfg = {
            **HF_CONFIGS[name],
            ("n_layer" if "n_layer" in HF_CONFIGS[name] else "num_hidden_layers"): layers,
        }
        model = hf_model(cfg, "cpu").to(dtype).train()
        ids = torch.randint(0, cfg["vocab_size"], (batch, seq))
        with activation_bytes(model) as counted:
            model(input_ids=ids, labels=ids).loss.backward()
        saved[layers] = counted["bytes"]
    shape = decoders.from_hf_config(HF_CONFIGS[name], seq=seq)
    assert saved[2] - saved[1] == memory.block_activation_bytes(shape, batch, e)
    assert saved[1] - (saved[2] - saved[1]) == memory.root_activation_bytes(shape, batch, e)


def test_hf_plan_is_the_same_plan():
    cfg = json.loads(next(p for p in SAMPLES if p.stem == "llama3-8b").read_text())
    shape = decoders.from_hf_config(cfg, seq=4096)
    p = memory.plan(shape, 1, 8, precision="bf16-mixed", gpu_bytes=80 * GIB)
    assert (
        sum(p["categories"][k] for k in ("params", "grads", "optimizer"))
        == 16 * shape.num_params // 8
    )
    assert p["peak"] == max(p["totals"].values()) and p["fits"]
    assert not memory.plan(shape, 1, 8, precision="bf16-mixed", gpu_bytes=24 * GIB)["fits"]


def test_cli_hf_config_reads_a_file_or_its_folder(run_cmd, tmp_path):
    sample = next(p for p in SAMPLES if p.stem == "llama3-8b")
    (tmp_path / "config.json").write_text(sample.read_text())
    for where in (sample, tmp_path):
        r = run_cli(
            run_cmd, "--hf-config", str(where), "--precision", "bf16-mixed", "--gpu-gib", "24"
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith("model: 8,030,261,248 parameters (8.030B; llama: 32 layers"), (
            r.stdout[:300]
        )
        assert "does NOT fit on a GPU of 24 GiB" in r.stdout and "what would fit:" in r.stdout
    gpt2 = run_cli(run_cmd, "--hf-config", str(next(p for p in SAMPLES if p.stem == "gpt2")))
    assert (
        "124,439,808 parameters" in gpt2.stdout
        and "note: activations assume dropout off" in gpt2.stdout
    )
    assert "note:" not in r.stdout  # the Llama-3 config: no dropout, no sliding window


def test_hf_notes_say_what_the_plan_assumes():
    mistral = {**HF_CONFIGS["mistral"], "sliding_window": 1024}
    assert decoders.notes(mistral, decoders.from_hf_config(mistral, seq=1024)) == []
    said = decoders.notes(mistral, decoders.from_hf_config(mistral, seq=4096))
    assert len(said) == 1 and "sliding window (1024) is shorter than seq 4096" in said[0]
    assert (
        "window (4096)"
        in decoders.notes(
            HF_CONFIGS["mistral"], decoders.from_hf_config(HF_CONFIGS["mistral"], seq=8192)
        )[0]
    )
    assert (
        decoders.notes(HF_CONFIGS["gpt2-tiny"], decoders.from_hf_config(HF_CONFIGS["gpt2-tiny"]))
        == []
    )
    gpt2 = {k: v for k, v in HF_CONFIGS["gpt2-tiny"].items() if not k.endswith("pdrop")}
    assert "gpt2's defaults" in decoders.notes(gpt2, decoders.from_hf_config(gpt2))[0]


@pytest.mark.parametrize(
    "cfg,said",
    [
        ({**SMALL_LLAMA, "model_type": "falcon"}, "cannot read 'model_type' 'falcon'"),
        ({k: v for k, v in SMALL_LLAMA.items() if k != "model_type"}, "cannot read 'model_type'"),
        ({k: v for k, v in SMALL_LLAMA.items() if k != "hidden_size"}, "cannot read 'hidden_size'"),
        (
            {k: v for k, v in SMALL_LLAMA.items() if k != "intermediate_size"},
            "cannot read 'intermediate_size'",
        ),
        ({**SMALL_LLAMA, "num_key_value_heads": 3}, "cannot read 'num_key_value_heads' 3"),
        ({**SMALL_LLAMA, "vocab_size": "big"}, "cannot read 'vocab_size'"),
        ({**SMALL_LLAMA, "hidden_act": "relu"}, "cannot read 'hidden_act' 'relu'"),
        (
            {k: v for k, v in HF_CONFIGS["gpt2-tiny"].items() if k != "n_positions"},
            "cannot read 'n_positions'",
        ),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_cli_bad_hf_config_is_one_line_exit_2(capsys, tmp_path, cfg, said):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert cli.main(["--hf-config", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and said in err, err


def test_cli_hf_config_refuses_what_it_cannot_open(capsys, tmp_path):
    (tmp_path / "bad.json").write_text("{not json")
    for args, said in [
        ([str(tmp_path / "missing")], "no config.json there"),
        ([str(tmp_path)], "no config.json there"),
        ([str(tmp_path / "bad.json")], "not a JSON file"),
        ([str(tmp_path / "bad.json"), "--params", "1e9"], "drop --params"),
    ]:
        assert cli.main(["--hf-config", *args]) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1 and said in err, err


def test_the_commands_readme_and_help_show_run(capsys, monkeypatch):
    """Every planner command in README.md and in --help's examples plans (exit 0)."""
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(repo)  # the commands name files from the repository's root
    text = (repo / "README.md").read_text() + cli.__doc__.replace("\\\\", "\\")
    commands = re.findall(
        r"python -m fsdp_course\.plan ((?:[^\n#]|\\\n)+)", text.replace("\\\n", " ")
    )
    commands = [c for c in commands if c.strip().startswith("--") and "--help" not in c]
    assert len(commands) >= 8, commands
    for command in commands:
        assert cli.main(shlex.split(command)) == 0, command
        capsys.readouterr()


HF_PEAK_PROBE = r"""
import json, sys, tempfile
import torch, torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from transformers import AutoConfig, AutoModelForCausalLM
sys.path.insert(0, "lessons/07_memory")
import probes  # lesson 7's tracked step: FSDPMemTracker by category

dist.init_process_group("gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1)
out = {}
for path, precision in json.loads(sys.argv[1]):
    cfg = json.load(open(path))
    torch.manual_seed(0)
    fields = {k: v for k, v in cfg.items() if k != "model_type"}
    model = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(cfg["model_type"], **fields)).train()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if precision == "bf16-mixed" else None,
                              reduce_dtype=torch.float32)
    for layer in model.base_model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    ids = torch.randint(0, cfg["vocab_size"], (2, 64))
    for step in range(3):  # the third step is steady: Adam's state exists
        mem = probes.StepMemory(model, opt, "fsdp2", enabled=step == 2)
        with mem:
            loss = model(input_ids=ids, labels=ids).loss
            mem.mark("forward")
            loss.backward()
            mem.mark("backward")
            opt.step()
            opt.zero_grad(set_to_none=True)
            mem.mark("step")
    r = mem.results()
    out[f"{path} {precision}"] = {"peak": r["peak"], "activations": r["activations"]}
print(json.dumps(out))
dist.destroy_process_group()
"""


def test_hf_plan_against_fsdp2_memory_tracker(run_cmd, repo_root):
    """The whole plan of a transformers model (fully_shard per decoder layer, then the root; the
    for-loop AdamW, CPU's default) against FSDPMemTracker on a real step: one rank here, two in
    the probe runs of the planner's commit (within 4% there too)."""
    runs = [
        (str(p), precision)
        for p in SAMPLES
        for name, precision in (("tiny-llama", "fp32"), ("tiny-qwen2", "bf16-mixed"))
        if p.stem == name
    ]
    r = run_cmd([sys.executable, "-c", HF_PEAK_PROBE, json.dumps(runs)], timeout=300, cwd=repo_root)
    assert r.returncode == 0, r.stderr[-2000:]
    measured = json.loads(r.stdout.strip().splitlines()[-1])
    for path, precision in runs:
        shape = decoders.from_hf_config(json.loads(Path(path).read_text()), seq=64)
        plan = memory.plan(shape, 2, 1, precision=precision, foreach=False)
        got = measured[f"{path} {precision}"]
        assert plan["categories"]["activations"] == pytest.approx(got["activations"], rel=0.01), (
            path
        )
        assert plan["peak"] == pytest.approx(got["peak"], rel=0.10), (
            path,
            precision,
            plan["peak"],
            got,
        )


def test_cli_unknown_family_as_a_command(run_cmd, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**SMALL_LLAMA, "model_type": "falcon"}))
    r = run_cli(run_cmd, "--hf-config", str(tmp_path))
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr == (
        f"python -m fsdp_course.plan: error: --hf-config {tmp_path / 'config.json'}: cannot read "
        "'model_type' 'falcon': the planner knows llama, mistral, qwen2, gpt2\n"
    )
