"""Ctrl-C while MindSpore runs graphs: exit 130 with one line, no temp files left, a second Ctrl-C exits at once.

MindSpore turns SIGINT into a SIGTERM that kills the process (exit 143) unless we catch it; these tests send a
real SIGINT to a real CLI in the middle of its work.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


def start(*args: str, cwd: Path | None = None) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=cwd, env=env)  # fmt: skip


def wait_for(condition, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the CLI never reached the point to interrupt"
        time.sleep(0.05)


def test_ctrl_c_during_export_leaves_no_temp_dir(cartpole_ckpt, tmp_path):
    out = tmp_path / "bundles" / "b"
    proc = start("msrl_consistency.export", "--ckpt", str(cartpole_ckpt), "--out", str(out))
    # Interrupt once the bundle's temp dir holds a written graph (MindSpore has compiled and exported by then).
    wait_for(lambda: any(p.name.startswith(".b.") and any(p.iterdir()) for p in out.parent.glob(".b.*")))
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert stderr.strip().splitlines()[-1].startswith("error: ") is False and "interrupted" in stderr
    assert list(out.parent.iterdir()) == []  # neither the bundle nor its temp dir


@pytest.mark.slow
def test_ctrl_c_during_verify_exits_130_and_twice_exits_at_once(cartpole_bundle, cartpole_ckpt, tmp_path):
    args = ("msrl_consistency.verify", "--bundle", str(cartpole_bundle.root), "--ckpt", str(cartpole_ckpt),
            "--out", str(tmp_path / "r"), "--episodes", "20")  # fmt: skip
    proc = start(*args)
    lines: list[str] = []
    wait_for(lambda: bool(lines.append(proc.stderr.readline()) or any("reference" in line for line in lines)))
    time.sleep(1.0)  # inside the reference's episodes: graphs compiled, MindSpore's handler installed
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, "".join(lines) + stderr[-2000:]
    assert "interrupted" in stderr and not (tmp_path / "r").exists()  # no report set, not even an empty --out
    proc = start(*args)
    lines = []
    wait_for(lambda: bool(lines.append(proc.stderr.readline()) or any("reference" in line for line in lines)))
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert proc.returncode == 130


@pytest.mark.parametrize("sig", [signal.SIGTERM])
def test_a_scheduler_sigterm_is_a_graceful_stop_too(cartpole_bundle, cartpole_ckpt, tmp_path, sig):
    proc = start("msrl_consistency.verify", "--bundle", str(cartpole_bundle.root), "--ckpt", str(cartpole_ckpt),
                 "--out", str(tmp_path / "r"))  # fmt: skip
    lines: list[str] = []
    wait_for(lambda: bool(lines.append(proc.stderr.readline()) or any("reference" in line for line in lines)))
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted" in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing half-written: no --out, no temp dir
