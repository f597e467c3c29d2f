"""The deploy-side episode player: runs with Lite only, and refuses a tampered bundle in one line."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from inference.lite_client import runner_available

pytestmark = pytest.mark.skipif(not runner_available()[0], reason=runner_available()[1])


def play(*args: str) -> subprocess.CompletedProcess[str]:
    # MindSpore is made unimportable: the deploy side must not need it.
    code = "import sys; sys.modules['mindspore'] = None\nfrom inference.play import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)


def test_play_runs_seeded_episodes_without_mindspore(cartpole_bundle):
    first = play(str(cartpole_bundle.root), "--episodes", "2", "--stochastic", "--seed", "4")
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("episode ") == 2 and "Lite 2.0.0" in first.stdout
    again = play(str(cartpole_bundle.root), "--episodes", "2", "--stochastic", "--seed", "4")
    assert again.stdout == first.stdout  # seeded noise: the same episodes


def test_play_refuses_tampered_bundle(cartpole_bundle, tmp_path):
    copy = tmp_path / "bundle"
    shutil.copytree(cartpole_bundle.root, copy)
    (copy / "policy.ms").write_bytes(b"\0" * 64)
    proc = play(str(copy), "--episodes", "1")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "sha256" in proc.stderr
