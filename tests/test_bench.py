"""inference.bench: the table and JSON it writes, the soak's drift detection, and its argument errors.

Timings are only checked for shape (percentiles ordered, rates positive), never against a bound.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import lite_build
import numpy as np
import pytest

from inference.bench import soak
from inference.lite.common import runner_available

pytestmark = pytest.mark.skipif(not runner_available()[0], reason=runner_available()[1])


BENCH = "import sys; sys.modules['mindspore'] = None\nfrom inference.bench import main\nsys.exit(main(sys.argv[1:]))"


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BENCH, *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_bench_writes_table_and_json(cartpole_bundle, tmp_path):
    out = tmp_path / "b" / "bench.json"
    proc = bench(str(cartpole_bundle.root), "--batch", "1,4,32", "--loops", "40", "--warmup", "3", "--soak",
                 "600", "--soak-inputs", "7", "--episodes", "2", "--seed", "5", "--json", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["lite_version"] == lite_build.VERSION
    assert result["lite_sdk"]["max_mind_ir_version"] == lite_build.MAX_MINDIR
    assert result["format"] == ("ms" if lite_build.MAX_MINDIR < 3 else "mindir")
    assert [r["batch"] for r in result["batches"]] == [1, 4, 32]
    for row in result["batches"]:
        assert 0 < row["p50_us"] <= row["p99_us"] <= row["p99.9_us"] and row["obs_per_s"] > 0
        assert row["per_obs_p50_us"] == pytest.approx(row["p50_us"] / row["batch"])
    s = result["soak"]
    assert s["requests"] == 600 and s["drifted_requests"] == 0 and s["runner_restarts"] == 0
    assert len(s["rss_samples"]) == 51 and s["rss_mb_start"] > 0 and s["rss_mb_max"] >= s["rss_mb_end"]
    assert "| batch | p50 µs | p99 µs | p99.9 µs | per obs p50 µs | obs/s |" in proc.stdout
    assert "bitwise drift: 0 requests" in proc.stdout
    # The task figure is play's episodes, seed for seed.
    play = subprocess.run([sys.executable, "-m", "inference.play", str(cartpole_bundle.root), "--episodes", "2",
                           "--seed", "5"], capture_output=True, text=True, timeout=300)  # fmt: skip
    returns = [float(line.split("return ")[1]) for line in play.stdout.splitlines() if line.startswith("episode")]
    assert result["episodes"]["returns"] == returns and result["episodes"]["mean_return"] == np.mean(returns)


def test_bench_times_onnxruntime_alongside_lite(cartpole_bundle, tmp_path):
    out = tmp_path / "bench.json"
    proc = bench(str(cartpole_bundle.root), "--batch", "1,16", "--loops", "20", "--warmup", "2", "--episodes", "0",
                 "--baseline", "onnxruntime", "--json", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    base = result["baseline"]
    assert base["runtime"] == "onnxruntime" and base["file"] == str(cartpole_bundle.file("policy", "onnx"))
    assert [r["batch"] for r in base["batches"]] == [r["batch"] for r in result["batches"]] == [1, 16]
    assert all(0 < r["p50_us"] <= r["p99_us"] and r["obs_per_s"] > 0 for r in base["batches"])
    assert "| batch | Lite p50 µs | ORT p50 µs | p50 / ORT |" in proc.stdout
    assert result["lite_inline"] and f"Lite {lite_build.VERSION} in this process, on the calling thread" in proc.stdout
    assert f"baseline: ONNX Runtime {base['version']} on policy.onnx" in proc.stdout


def test_bench_baseline_needs_the_graphs_onnx_file(cartpole_bundle, tmp_path):
    bundle = tmp_path / "no-onnx"
    shutil.copytree(cartpole_bundle.root, bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["graphs"]["policy"]["files"]["onnx"] = {"format": "onnx", "failed": "ONNX: an operator it lacks"}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    proc = bench(str(bundle), "--episodes", "0", "--baseline", "onnxruntime", "--json", str(tmp_path / "x.json"))
    assert proc.returncode == 2 and not (tmp_path / "x.json").exists()
    assert proc.stderr.strip() == (f"error: --baseline onnxruntime: bundle {bundle}: policy.onnx failed at export "
                                   "(ONNX: an operator it lacks)")  # fmt: skip


def test_bench_stochastic_graph(cartpole_bundle, tmp_path):
    out = tmp_path / "bench.json"
    proc = bench(str(cartpole_bundle.root), "--graph", "policy_sample", "--batch", "2", "--loops", "5",
                 "--episodes", "0", "--json", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["graph"] == "policy_sample" and "episodes" not in result and "soak" not in result


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch", "0"], "--batch sizes must be within 1-65536"),
        (["--batch", "1,x"], "--batch must be comma-separated integers"),
        (["--loops", "0"], "--loops must be >= 1"),
        (["--soak", "-5"], "--soak must be >= 0"),
        (["--graph", "nope"], "bundle"),
    ],
)
def test_bench_bad_arguments(cartpole_bundle, tmp_path, args, message):
    proc = bench(str(cartpole_bundle.root), *args, "--json", str(tmp_path / "x.json"))
    assert proc.returncode == 2 and proc.stderr.startswith(f"error: {message}")
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.json").exists()


def test_bench_missing_bundle(tmp_path):
    proc = bench(str(tmp_path / "nope"))
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: bundle {tmp_path / 'nope'} does not exist"


class _DriftingPolicy:
    """Answers like a policy, except that one request gets an answer one ulp off."""

    class model:  # noqa: N801 - stands in for the runtime behind the policy
        pid = None
        restarts = 0

    def __init__(self, bundle, drift_at: int) -> None:
        self.bundle, self.calls, self.drift_at = bundle, 0, drift_at
        self.contract = bundle.contract("policy")

    def act_outputs(self, obs: np.ndarray, state: None = None) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        self.calls += 1
        logits = obs[:, :2] * 2
        if self.calls == self.drift_at:
            logits = np.nextafter(logits, np.inf, dtype=np.float32)
        return logits.argmax(-1), {"logits": logits}


def test_soak_detects_bitwise_drift(cartpole_bundle):
    bundle = cartpole_bundle
    clean = soak(_DriftingPolicy(bundle, drift_at=-1), requests=50, distinct=5, seed=0)
    assert clean["drifted_requests"] == 0 and clean["drift_max_abs"] == 0
    drifted = soak(_DriftingPolicy(bundle, drift_at=23), requests=50, distinct=5, seed=0)
    assert drifted["drifted_requests"] == 1 and 0 < drifted["drift_max_abs"] < 1e-4  # one ulp
    first = soak(_DriftingPolicy(bundle, drift_at=3), requests=50, distinct=5, seed=0)  # first answer off
    assert first["drifted_requests"] == 9  # every later repeat of that input differs from it


def _shape_bundle(shape: str, out):
    """A bundle of ``shape`` and the arguments that name its env for play and bench."""
    import foreign_policies as fp
    from byo_examples import EXAMPLES, example_module

    from inference.bundle.contract import PolicyContract
    from msrl_consistency.api import export_policy

    if shape == "gru":  # CartPole-v1, the contract's env id
        make = example_module(EXAMPLES / "recurrent", "bench_recurrent_policy").make_policy
        contract = PolicyContract.from_toml(EXAMPLES / "recurrent" / "contract.toml")
        return export_policy(make(), contract, out), []
    if shape == "dict":
        return export_policy(fp.make_dict_policy(), fp.DICT_CONTRACT, out), ["--env", "foreign_envs:make_dict"]
    return export_policy(fp.make_two_head(), fp.TWO_HEAD_CONTRACT, out), ["--env", "foreign_envs:make_two_head"]


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["dict", "two_head", "gru"])
def test_bench_and_play_take_every_policy_shape_and_a_teams_own_env(tmp_path, shape):
    """A Dict observation (vector + uint8 frame), two heads and a carried state: bench feeds every input the graph
    takes, the soak holds bitwise, and episodes run in the team's own env (``--env MODULE:FACTORY``)."""
    bundle, env = _shape_bundle(shape, tmp_path / "b")
    out = tmp_path / "bench.json"
    tests = str(Path(lite_build.__file__).parent)  # foreign_envs imports from there, as a team's module would
    proc = subprocess.run([sys.executable, "-c", BENCH, str(bundle.root), "--batch", "1,8", "--loops", "20",
                           "--soak", "300", "--soak-inputs", "5", "--episodes", "2", *env, "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=tests)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert [r["batch"] for r in result["batches"]] == [1, 8] and result["soak"]["drifted_requests"] == 0
    assert len(result["episodes"]["returns"]) == 2
    play = subprocess.run([sys.executable, "-m", "inference.play", str(bundle.root), "--episodes", "2", *env],
                          capture_output=True, text=True, timeout=300, cwd=tests)  # fmt: skip
    assert play.returncode == 0, play.stderr[-2000:]
    returns = [float(line.split("return ")[1]) for line in play.stdout.splitlines() if line.startswith("episode")]
    assert result["episodes"]["returns"] == returns
