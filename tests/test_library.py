"""The shared library on its own: process-group exits and timeouts under torchrun, data
determinism, config flags, the theory's formulas."""

import sys
import textwrap
import time

import pytest
import torch

from helpers import run_cmd
from fsdp_course import theory
from fsdp_course.config import parse_config
from fsdp_course.data import load_data
from fsdp_course.dist import CourseError
from fsdp_course.model import GPT, Block, ModelConfig, num_params

SCRIPT = textwrap.dedent("""
    import sys
    import torch.distributed as dist
    from fsdp_course.dist import CourseError, distributed
    with distributed() as env:
        what = sys.argv[1]
        if what == "course-error":
            if env.rank == 0:
                __import__("time").sleep(1)  # rank 1 gets there first: rank 0 must still speak
            raise CourseError("checkpoint was written by another model")
        if what == "bug":
            raise ValueError("something broke\\nsecond line of a long message")
        if what == "stuck" and env.rank == 0:
            dist.all_reduce(__import__("torch").ones(1))  # rank 1 never joins
        env.print0("finished")
""")


def torchrun(tmp_path, *args, env=None, nproc=2):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    return run_cmd([sys.executable, "-m", "fsdp_course.torchrun", "--standalone",
                    f"--nproc-per-node={nproc}", script, *args], env=env, timeout=120)


def test_clean_run_exits_0_without_abort(tmp_path):
    proc = torchrun(tmp_path, "ok")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("finished") == 1  # rank 0 only
    assert "terminate called" not in proc.stderr


def test_course_error_is_one_line_and_exit_2(tmp_path):
    proc = torchrun(tmp_path, "course-error")
    assert proc.returncode == 2
    assert [l for l in proc.stderr.splitlines() if l.startswith("error:")] == [
        "error: checkpoint was written by another model"]
    assert "Traceback" not in proc.stderr


def test_unexpected_exception_is_one_line_per_rank_and_exit_1(tmp_path):
    proc = torchrun(tmp_path, "bug")
    assert proc.returncode == 1
    errors = [l for l in proc.stderr.splitlines() if "error: ValueError" in l]
    assert len(errors) == 2 and "second line" not in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_stuck_collective_fails_in_bounded_time(tmp_path):
    start = time.monotonic()
    proc = torchrun(tmp_path, "stuck", env={"COURSE_TIMEOUT_S": "3"})
    assert proc.returncode != 0
    assert time.monotonic() - start < 60
    assert "COURSE_TIMEOUT_S" in proc.stderr or "rank" in proc.stderr


def test_bad_timeout_setting_is_refused(tmp_path):
    proc = torchrun(tmp_path, "ok", env={"COURSE_TIMEOUT_S": "soon"})
    assert proc.returncode == 2 and "COURSE_TIMEOUT_S" in proc.stderr


def test_global_batch_is_the_union_of_rank_batches():
    data = load_data(seed=3)
    x_all, y_all = data.batch(5, 0, 1, 6, 16)
    parts = [data.batch(5, r, 3, 2, 16) for r in range(3)]
    assert torch.equal(torch.cat([p[0] for p in parts]), x_all)
    assert torch.equal(torch.cat([p[1] for p in parts]), y_all)
    assert torch.equal(y_all[:, :-1], x_all[:, 1:])  # targets are the next characters
    assert not torch.equal(data.batch(6, 0, 1, 6, 16)[0], x_all)


def test_data_from_a_text_file(tmp_path):
    text = tmp_path / "corpus.txt"
    text.write_text("hello fsdp world. " * 100)
    data = load_data(str(text))
    assert data.vocab == "".join(sorted(set("hello fsdp world. ")))
    assert data.decode(data.tokens[:5].tolist()) == "hello"
    with pytest.raises(CourseError, match="no such file"):
        load_data(str(tmp_path / "missing.txt"))


def test_config_flags_from_a_dataclass():
    from dataclasses import dataclass, field

    @dataclass
    class Config:
        steps: int = 3
        mixed_precision: bool = False
        strategy: str = field(default="FULL_SHARD", metadata={"choices": ["FULL_SHARD", "NO_SHARD"]})
        data: str | None = None

    cfg = parse_config(Config, argv=["--steps", "7", "--mixed-precision", "--strategy", "NO_SHARD"])
    assert (cfg.steps, cfg.mixed_precision, cfg.strategy, cfg.data) == (7, True, "NO_SHARD", None)
    with pytest.raises(SystemExit) as exc:
        parse_config(Config, argv=["--strategy", "ZERO9"])
    assert exc.value.code == 2


def test_unit_numels_and_padding_theory():
    model = GPT(ModelConfig(vocab_size=27))
    units = theory.fsdp_unit_numels(model, Block)
    assert len(units) == 5 and sum(units) == num_params(model)
    assert theory.shard_numel(10, 4) == 3 and theory.shard_numel(8, 4) == 2
    assert theory.model_state_bytes([10], 4, "FULL_SHARD") == {"params": 12, "grads": 12, "optimizer": 24}
    assert theory.model_state_bytes([10], 4, "NO_SHARD") == theory.ddp_state_bytes(10)
    assert theory.collective_bytes([8, 4], 2, "FULL_SHARD") == {"all_gather": 4 * (8 + 4 + 4),
                                                                "reduce_scatter": 4 * 12}
    assert theory.ring_sent_bytes("all_reduce", 100, 4) == 150
