"""The deploy side on its own: a fresh venv, ``pip install ./inference``, the runner built into that venv
against the Lite SDK, then doctor, bench, play and the on-device golden check, with no MindSpore anywhere in
that environment.

Nothing here skips: a venv that cannot be built (no network and no pip cache, a broken pyproject) fails the
test with pip's reason. pip may use its cache.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import lite_build
import pytest

REPO = Path(__file__).resolve().parents[1]
# What `pip install ./inference` may bring, besides pip/setuptools that come with the venv itself.
DEPLOY_PACKAGES = {"msrl-consistency-deploy", "numpy", "gymnasium", "cloudpickle", "farama-notifications",
                   "typing-extensions"}  # fmt: skip
VENV_OWN = {"pip", "setuptools", "wheel"}


def _run(cmd: list[str], what: str, cwd: Path, env: dict[str, str], timeout: float = 600):
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)
    assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{proc.stderr[-3000:]}\n{proc.stdout[-2000:]}"
    return proc


def tampered_copy(bundle, other, out: Path) -> Path:
    """``bundle`` with its .ms graphs swapped for ``other``'s and the manifest's hashes updated to match: a
    consistent bundle that no longer holds the trained policy (a golden file recorded from ``bundle`` refuses it)."""
    from inference.bundle import sha256_file

    shutil.copytree(bundle.root, out)
    manifest = json.loads((out / "manifest.json").read_text())
    for graph in manifest["graphs"].values():
        entry = graph["files"]["ms"]
        shutil.copy(other.root / entry["file"], out / entry["file"])
        entry["sha256"] = sha256_file(out / entry["file"])
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


@pytest.mark.slow
def test_deploy_side_installs_and_runs_without_mindspore(cartpole_bundle, cartpole_ckpt, tmp_path: Path) -> None:
    # The source is copied so pip's in-tree build leaves nothing in the checkout.
    src = tmp_path / "src" / "inference"
    shutil.copytree(REPO / "inference", src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MSRL_LITE", "PYTHON", "VIRTUAL_ENV"))}
    env["GLOG_v"] = "3"
    work = tmp_path / "work"  # cwd without the checkout, so only the installed package can be imported
    work.mkdir()

    _run([sys.executable, "-m", "venv", str(venv)], "python -m venv", work, env, timeout=300)
    py = str(venv / "bin" / "python")
    _run([py, "-m", "pip", "install", "--disable-pip-version-check", "-q", str(src)], "pip install", work, env)

    listed = json.loads(_run([py, "-m", "pip", "list", "--format", "json"], "pip list", work, env).stdout)
    names = {p["name"].lower().replace("_", "-") for p in listed}
    assert names - VENV_OWN == DEPLOY_PACKAGES, names
    blocked = subprocess.run([py, "-c", "import mindspore"], capture_output=True, text=True, cwd=work, env=env)
    assert blocked.returncode != 0 and "No module named 'mindspore'" in blocked.stderr
    where = _run([py, "-c", "import inference; print(inference.__file__)"], "import", work, env).stdout
    assert str(venv) in where

    # One command builds the runner into the venv's bin, where LiteRunner finds it without MSRL_LITE_RUNNER.
    build = [py, "-m", "inference.build_runner", "--sdk", str(REPO / ".lite" / "sdk"), "--runner-only"]
    _run(build, "build_runner", work, env)
    assert (venv / "bin" / "msrl-lite-runner").is_file() and (venv / "bin" / "msrl-lite-runner.json").is_file()
    for lib in ("libmsrl-lite.so", "libmsrl-lite-inline.so"):  # Lite in the calling process: the deploy default
        assert (venv / "bin" / lib).is_file()

    doctor = _run([str(venv / "bin" / "msrl-doctor"), str(cartpole_bundle.root), "--json"], "doctor", work, env)
    report = json.loads(doctor.stdout)
    assert report["compatible"] and report["environment"]["mindspore"] is None
    assert report["environment"]["lite"]["runner"] == str(venv / "bin" / "msrl-lite-runner")
    assert report["environment"]["lite"]["lite_version"] == lite_build.VERSION
    assert {c["name"]: c["here"] for c in report["checks"]}["lite-in-process"] == "on the calling thread"

    out = work / "bench.json"
    bench = [py, "-m", "inference.bench", str(cartpole_bundle.root), "--batch", "1,16", "--loops", "20",
             "--warmup", "2", "--soak", "300", "--episodes", "1", "--json", str(out)]  # fmt: skip
    _run(bench, "bench", work, env)
    result = json.loads(out.read_text())
    assert result["lite_version"] == lite_build.VERSION and result["lite_sdk"]["lite_version"] == lite_build.VERSION
    assert result["soak"]["drifted_requests"] == 0 and [b["batch"] for b in result["batches"]] == [1, 16]
    assert result["lite_in_process"] and result["runner"] == str(venv / "bin" / "libmsrl-lite.so")
    assert result["lite_inline"]  # and the graph ran on the calling thread

    play = _run([py, "-m", "inference.play", str(cartpole_bundle.root), "--episodes", "1"], "play", work, env)
    assert "mean return" in play.stdout and f"Lite {lite_build.VERSION} in this process" in play.stdout
    assert float(play.stdout.split("return ")[1].split()[0]) == result["episodes"]["returns"][0]

    # The on-device check: a golden file recorded here (the training side), checked there with the deploy side only.
    from conftest import train_tiny

    from inference.compare.golden import save_golden
    from inference.compare.verifier import VerifyOptions
    from msrl_consistency.api import export_run, verify_run
    from msrl_consistency.artifacts.bundle import ExportOptions

    golden = tmp_path / "golden.npz"
    reference = verify_run(cartpole_bundle, cartpole_ckpt, VerifyOptions(observations=300, episodes=2, seed=1,
                                                                        runtimes=("ms-mindir",))).reference  # fmt: skip
    save_golden(golden, reference, cartpole_bundle, "CartPole-v1")
    check = [str(venv / "bin" / "msrl-check"), str(cartpole_bundle.root), "--golden", str(golden), "--quiet"]
    ok = subprocess.run([*check, "--out", str(work / "r-ok")], capture_output=True, text=True, cwd=work, env=env)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-2000:]
    report = json.loads((work / "r-ok" / "report.json").read_text())
    assert report["reference"] == "golden:golden.npz" and report["runtimes"]["lite"]["status"] == "ran"
    assert report["runtimes"]["lite"]["versions"]["lite_process"] == "in this process"
    assert {c["name"] for c in report["checks"]} >= {"observations.policy", "episodes.free_running.stochastic"}
    other = export_run(train_tiny(tmp_path / "other", "CartPole-v1", seed=7), tmp_path / "other-bundle",
                       ExportOptions(formats=("ms",)))  # fmt: skip
    tampered = tampered_copy(cartpole_bundle, other, tmp_path / "tampered")
    bad = subprocess.run([check[0], str(tampered), *check[2:], "--out", str(work / "r-bad")], capture_output=True,
                         text=True, cwd=work, env=env)  # fmt: skip
    # the golden file is bound to the manifest it was recorded from: a bundle rewritten since is refused, both named
    assert bad.returncode == 2, bad.stdout[-3000:] + bad.stderr[-2000:]
    assert "recorded from another bundle" in bad.stderr and str(tampered) in bad.stderr
