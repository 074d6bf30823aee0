"""launch/slurm/lesson.sbatch, for real: a two-node SLURM cluster on this machine
(launch/slurm/local_cluster.sh: munged, slurmctld and two slurmd), lesson 8's HSDP run submitted
with sbatch, its metrics checked. Skipped, with the reason, where SLURM is not installed
(.ci/run installs Debian's slurmctld, slurmd, slurm-client and munge when it runs as root)."""

from __future__ import annotations

import json
import os
import shutil
import socket

import pytest

from helpers import REPO_ROOT, run_cmd

TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "sinfo")
missing = [tool for tool in TOOLS if shutil.which(tool) is None]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(missing),
        reason=f"SLURM is not installed here (no {', '.join(missing)}); "
        "install Debian's slurmctld slurmd slurm-client munge (.ci/run does, as root)",
    ),
    pytest.mark.skipif(
        os.geteuid() != 0, reason="the local SLURM cluster needs root (slurmd starts the jobs)"
    ),
]


@pytest.fixture
def cluster(tmp_path):
    state = tmp_path / "slurm"
    script = REPO_ROOT / "launch" / "slurm" / "local_cluster.sh"
    started = run_cmd(["bash", script, "start", state], timeout=60)
    if started.returncode != 0:
        pytest.skip(f"the local SLURM cluster did not start: {started.stderr.strip()[-500:]}")
    try:
        yield {"SLURM_CONF": started.stdout.strip().split("=", 1)[1]}
    finally:
        run_cmd(["bash", script, "stop", state], timeout=30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sbatch_runs_lesson8_hsdp_on_two_nodes(cluster, tmp_path):
    metrics, log = tmp_path / "metrics.json", tmp_path / "slurm-%j.out"
    info = run_cmd(["sinfo", "-h", "-o", "%P %t %D"], env=cluster, timeout=30)
    assert info.stdout.split() == ["course*", "idle", "2"], info.stdout + info.stderr
    r = run_cmd(
        [
            "sbatch",
            "--wait",
            f"--output={log}",
            f"--chdir={REPO_ROOT}",
            str(REPO_ROOT / "launch" / "slurm" / "lesson.sbatch"),
            "8",
            "--replicas",
            "2",
            "--steps",
            "2",
            "--metrics",
            str(metrics),
        ],
        env={**cluster, "MASTER_PORT": free_port()},
        timeout=300,
    )
    logs = "".join(p.read_text() for p in tmp_path.glob("slurm-*.out"))
    assert r.returncode == 0, r.stdout + r.stderr + logs[-3000:]
    assert "2 nodes (n[0-1])" in logs and "--nnodes=2" in logs and "--rdzv-backend=c10d" in logs
    m = json.loads(metrics.read_text())
    assert m["world_size"] == 4 and m["results"]["nodes"] == [0, 0, 1, 1]
    assert m["results"]["mesh"] == {"shape": [2, 2], "names": ["replicate", "shard"]}
    scoped = m["results"]["collectives"]
    assert set(scoped["intra"]) == {"all_gather", "reduce_scatter"} and set(scoped["inter"]) == {
        "all_reduce"
    }
    assert m["results"]["grad_check"]["max_abs_diff"] < 1e-6
