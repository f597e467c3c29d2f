"""Data parallel end to end: 2 ranks under msrun on CPU (mccl), as ``train --workers 2`` runs them.

Each launch costs 10-20 s on 2 cores (three MindSpore processes start, the cluster forms, then finalises), so
there are four: an uninterrupted run, a run whose rank 1 is killed with SIGKILL, its resume, and a run whose
ranks diverge.
"""

from __future__ import annotations

import csv
import ipaddress
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import msrl_consistency.train as train
from inference.errors import UsageError
from msrl_consistency.artifacts import run_dir as rd
from msrl_consistency.artifacts.checkpoint import read_checkpoint

REPO = Path(__file__).resolve().parents[1]
FAULT_TRAIN = Path(__file__).with_name("fault_train.py")  # the training CLI plus a fault hook (tests only)
# 6 iterations of 2 ranks x 2 envs x 16 steps; checkpoints every 2 iterations. Reward normalisation is on so that
# its statistics, like the observation statistics, are merged over ranks, checked equal and resumed.
ARGS = ["--env-id", "CartPole-v1", "--workers", "2", "--num-envs", "2", "--num-steps", "16", "--num-minibatches", "2",
        "--update-epochs", "2", "--total-steps", "384", "--checkpoint-every", "2", "--eval-episodes", "2",
        "--normalize-reward", "true", "--updates-per-call", "2", "--progress", "false"]  # fmt: skip
TIMING_COLUMNS = {"sps", "wall_time"}


def launch(run_dir: Path, *extra: str, fault: str | None = None) -> subprocess.Popen:
    """``python -m msrl_consistency.train``, or with a ``fault`` its test twin ``tests/fault_train.py``."""
    command = ["-m", "msrl_consistency.train"] if fault is None else [str(FAULT_TRAIN)]
    cmd = [sys.executable, *command, *ARGS, "--run-dir", str(run_dir), *extra]
    env = {**os.environ, **({"MSRL_TRAIN_FAULT": fault} if fault else {})}
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def metrics(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / rd.METRICS_CSV, newline="") as fh:
        return [{k: v for k, v in row.items() if k not in TIMING_COLUMNS} for row in csv.DictReader(fh)]


def weights(run_dir: Path) -> dict[str, np.ndarray]:
    return {k: v.asnumpy() for k, v in read_checkpoint(run_dir / rd.CHECKPOINT).items()}


def listeners_while_running(proc: subprocess.Popen) -> dict[int, set[str]]:
    """Listening addresses of every process under ``proc`` (msrun, its scheduler, the ranks), sampled until it ends."""
    seen: dict[int, set[str]] = {}
    root = psutil.Process(proc.pid)
    while proc.poll() is None:
        try:
            children = root.children(recursive=True)
        except psutil.NoSuchProcess:
            break
        for child in children:
            try:
                conns = child.net_connections(kind="inet")
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            for c in conns:
                if c.status == psutil.CONN_LISTEN:
                    seen.setdefault(child.pid, set()).add(c.laddr.ip)
        time.sleep(0.2)
    return seen


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("dp") / "full"
    code, out, err = finish(launch(run_dir))
    assert code == 0, err[-3000:]
    assert "with 2 workers" in out and "rank checksums equal" in out
    return run_dir


@pytest.mark.slow
def test_two_workers_agree_and_rank0_checkpoint_exports_and_verifies(full_run, tmp_path):
    info = rd.read_run_json(full_run)
    assert info["world_size"] == 2 and info["global_step"] == 384 and info["iteration"] == 6
    assert len(info["rank_checksums"]) == 2 and info["rank_checksums"][0] == info["rank_checksums"][1]
    assert info["seeds"]["ranks"][1]["env_reset"] == [3, 4] and info["seeds"]["ranks"][1]["noise"] == [1, 1, 1]
    assert [int(r["global_step"]) for r in metrics(full_run)] == [64, 128, 192, 256, 320, 384]
    state = rd.load_resume_state(full_run / rd.RESUME_STATE)
    # Both ranks' discounted returns went into the reward statistics (one rank's alone: 192 of them).
    assert state["ret_rms"][2] == pytest.approx(384 + 1e-4) and state["rms"][2] == pytest.approx(384 + 1e-4)
    with open(full_run / rd.EPISODES_CSV, newline="") as fh:
        envs = {int(r["env"]) for r in csv.DictReader(fh)}
    assert envs & {0, 1} and envs & {2, 3}  # episodes of both ranks, logged once by rank 0
    logs = full_run / rd.LOG_DIR / "launch-1"
    assert {p.name for p in logs.iterdir()} >= {"worker_0.log", "worker_1.log", "scheduler.log", "msrun.log"}
    assert [json.loads((logs / f"rank_{r}.json").read_text())["exit_code"] for r in (0, 1)] == [0, 0]

    bundle = tmp_path / "bundle"
    export = [sys.executable, "-m", "msrl_consistency.export", "--ckpt", str(full_run / rd.CHECKPOINT),
              "--out", str(bundle)]  # fmt: skip
    proc = subprocess.run(export, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    verify = [sys.executable, "-m", "msrl_consistency.verify", "--mindir", str(bundle / "policy.mindir"),
              "--ckpt", str(full_run / rd.CHECKPOINT), "--out", str(tmp_path / "report"), "--observations", "500",
              "--episodes", "2", "--quiet"]  # fmt: skip
    proc = subprocess.run(verify, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert json.loads((bundle / "manifest.json").read_text())["precision"] == "fp32"


@pytest.mark.slow
def test_killed_worker_is_named_and_the_run_resumes_bitwise(full_run, tmp_path):
    run_dir = tmp_path / "cut"
    proc = launch(run_dir, fault="kill:1:3")  # rank 1 SIGKILLs itself once 3 iterations are done
    listening = listeners_while_running(proc)
    code, _, err = finish(proc)
    assert code == 128 + 9, err[-3000:]
    assert "error: rank 1 (pid" in err and "killed by signal 9 (SIGKILL)" in err
    assert f"--resume {run_dir}" in err and "iteration 2, step 128" in err
    # Every listener (msrun's scheduler, the ranks) was on loopback; at least the scheduler and both ranks.
    assert len(listening) >= 3, listening
    assert all(ipaddress.ip_address(ip).is_loopback for ips in listening.values() for ip in ips), listening

    # The last complete checkpoint is intact (iteration 2), nothing half-written lies around.
    assert rd.read_run_json(run_dir)["iteration"] == 2
    assert rd.load_resume_state(run_dir / rd.RESUME_STATE)["world_size"] == 2
    assert not list(run_dir.glob(".*.tmp"))
    weights(run_dir)  # CRC-checked load

    code, out, err = finish(launch(run_dir, "--resume", str(run_dir)))
    assert code == 0, err[-3000:]
    assert (run_dir / rd.LOG_DIR / "launch-2").is_dir()
    assert metrics(run_dir) == metrics(full_run)
    assert (run_dir / rd.EPISODES_CSV).read_text() == (full_run / rd.EPISODES_CSV).read_text()
    expected, got = weights(full_run), weights(run_dir)
    assert expected.keys() == got.keys()
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    assert rd.read_run_json(run_dir)["rank_checksums"] == rd.read_run_json(full_run)["rank_checksums"]


@pytest.mark.slow
@pytest.mark.parametrize("workers", ["1", "3"])
def test_resume_with_another_world_size_is_refused(full_run, workers):
    before = (full_run / rd.RUN_JSON).read_text()
    with pytest.raises(UsageError, match="trained with 2 workers; resume it with the same world size"):
        train.main(["--resume", str(full_run), "--workers", workers])
    assert (full_run / rd.RUN_JSON).read_text() == before
    assert sorted(p.name for p in (full_run / rd.LOG_DIR).iterdir()) == ["launch-1"]


@pytest.mark.slow
def test_diverged_ranks_stop_the_run_naming_the_ranks_and_the_parameter(tmp_path):
    run_dir = tmp_path / "diverged"
    # Rank 1 nudges one weight as the first iteration starts; the check after that iteration must catch it.
    proc = launch(run_dir, "--total-steps", "192", "--check-every", "1", fault="perturb:1:0")
    code, _, err = finish(proc)
    assert code == 1, err[-3000:]
    assert (
        "exited with code 1: at iteration 1: ranks diverged (rank 1 vs rank 0): rank 1 differs from rank 0, "
        "first in 'policy.actor.layers.0.weight'" in err
    )
    # The checkpoint written before the divergence (iteration 0, both ranks agreeing) is what stays.
    info = rd.read_run_json(run_dir)
    assert info["iteration"] == 0 and info["rank_checksums"][0] == info["rank_checksums"][1]
