"""Proof that the gate works: a genuine export passes; each injected fault fails with the right diagnosis."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from msrl_consistency.api import export_run, verify_run
from msrl_consistency.artifacts.bundle import ExportOptions
from msrl_consistency.compare.golden import load_golden, save_golden
from msrl_consistency.compare.verifier import VerifyOptions
from msrl_consistency.errors import UsageError
from msrl_consistency.report.writers import write_reports
from msrl_consistency.runtimes.base import RuntimeSource
from msrl_consistency.runtimes.registry import create

FAST = dict(observations=800, episodes=2, seed=3)


def stages(result) -> set[str]:
    return {c.diagnosis["stage"] for c in result.failed if c.diagnosis}


def test_genuine_export_passes_and_writes_reports(cartpole_bundle, cartpole_ckpt, tmp_path):
    result = verify_run(cartpole_bundle, cartpole_ckpt, VerifyOptions(**FAST))
    assert result.exit_code == 0, [c.summary for c in result.failed]
    ran = {n for n, info in result.runtimes.items() if info["status"] == "ran"}
    assert {"ms-graph", "ms-mindir", "onnxruntime"} <= ran
    names = {(c.runtime, c.name) for c in result.checks}
    assert ("ms-mindir", "episodes.free_running.stochastic") in names
    assert ("env", "env_determinism") in names
    paths = write_reports(result, tmp_path / "report")
    report = json.loads(paths["json"].read_text())
    assert report["schema"] == "msrl-consistency/verify-report" and report["passed"] and report["schema_version"] == 2
    assert "<testsuite" in paths["junit"].read_text() and paths["plot"].stat().st_size > 1000
    logits = next(c for c in report["checks"] if c["runtime"] == "ms-mindir" and c["name"] == "observations.policy")
    assert logits["metrics"]["argmax"]["flips"] == 0 and logits["metrics"]["outputs"]["logits"]["max_abs"] == 0.0


def faulty_bundle(ckpt, out, mutate=None, **options):
    from msrl_consistency.agent import PolicySpec
    from msrl_consistency.artifacts import run_dir as rd
    from msrl_consistency.artifacts.checkpoint import load_policy

    policy = load_policy(ckpt, PolicySpec.from_dict(rd.read_run_json(ckpt.parent)["policy_spec"]))
    if mutate:
        mutate(policy)
    return export_run(ckpt, out, ExportOptions(formats=("mindir",), **options), policy=policy)


def _no_norm(policy):
    policy.normalizer.enabled = False


def _perturb(policy):
    w = policy.actor.layers[0].weight
    value = w.asnumpy()
    value[0, 0] += 1e-3
    w.set_data(type(w.value())(value))


def _no_scaling(policy):
    policy.postprocess.enabled = False


@pytest.mark.parametrize(
    ("env", "mutate", "options", "tolerance", "stage"),
    [
        ("pendulum", _no_norm, {}, None, "preprocessing"),
        ("cartpole", _no_norm, {}, None, "preprocessing"),
        ("pendulum", _perturb, {}, None, "network"),
        ("pendulum", None, {"precision": "fp16"}, "fp32", "precision"),
        ("pendulum", _no_scaling, {}, None, "postprocessing"),
    ],
    ids=["no-normalisation-box", "no-normalisation-discrete", "perturbed-weight", "fp16-under-fp32", "no-scaling"],
)
def test_injected_fault_is_caught_and_diagnosed(request, tmp_path, env, mutate, options, tolerance, stage):
    ckpt = request.getfixturevalue(f"{env}_ckpt")
    bundle = faulty_bundle(ckpt, tmp_path / "bundle", mutate, **options)
    result = verify_run(bundle, ckpt, VerifyOptions(**FAST, tolerance=tolerance, runtimes=("ms-mindir",)))
    assert result.exit_code == 1
    assert stage in stages(result), [(c.name, c.diagnosis) for c in result.failed]


def test_fp16_export_passes_under_fp16_tolerance(pendulum_ckpt, tmp_path):
    bundle = faulty_bundle(pendulum_ckpt, tmp_path / "bundle", precision="fp16")
    result = verify_run(bundle, pendulum_ckpt, VerifyOptions(**FAST, runtimes=("ms-mindir",)))
    obs_checks = [c for c in result.checks if c.name.startswith("observations")]
    assert all(c.status == "pass" for c in obs_checks), [c.summary for c in obs_checks]


class OtherNoiseStream:
    """A deploy side that draws its sampling noise from another generator than training."""

    def __init__(self, inner):
        self.inner, self.rng = inner, np.random.default_rng(999)

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def infer(self, obs, noise=None):
        if noise is None:
            return self.inner.infer(obs)
        other = (
            self.rng.random(noise.shape, dtype=np.float32)
            if noise.min() >= 0
            else self.rng.standard_normal(noise.shape, dtype=np.float32)
        )
        return self.inner.infer(obs, other)


@pytest.mark.parametrize("env", ["cartpole", "pendulum"])
def test_different_noise_stream_is_a_sampling_fault(request, env):
    bundle, ckpt = request.getfixturevalue(f"{env}_bundle"), request.getfixturevalue(f"{env}_ckpt")
    source = RuntimeSource(bundle)
    deploy = {"policy": create("ms-mindir", source, "policy"),
              "policy_sample": OtherNoiseStream(create("ms-mindir", source, "policy_sample"))}  # fmt: skip
    result = verify_run(bundle, ckpt, VerifyOptions(**FAST, runtimes=("ms-graph",)), extra_runtimes={"deploy": deploy})
    assert result.exit_code == 1
    assert stages(result) == {"sampling"}
    failed = {c.name for c in result.failed}
    assert "observations.policy" not in failed and "observations.policy_sample" in failed


def test_bundle_from_another_checkpoint_is_a_provenance_fault(cartpole_bundle, tmp_path):
    from conftest import train_tiny

    other = train_tiny(tmp_path / "other", "CartPole-v1", seed=7)
    result = verify_run(cartpole_bundle, other, VerifyOptions(**FAST, runtimes=("ms-mindir",)))
    assert result.exit_code == 1
    assert "provenance" in stages(result) or any(c.name == "provenance" for c in result.failed)


def test_golden_file_round_trip_without_mindspore(cartpole_bundle, cartpole_ckpt, tmp_path):
    golden = tmp_path / "not-yet-created" / "golden.npz"
    result = verify_run(cartpole_bundle, cartpole_ckpt, VerifyOptions(**FAST, runtimes=("onnxruntime",)))
    save_golden(golden, result.reference, cartpole_bundle, "CartPole-v1")
    ref = load_golden(golden, cartpole_bundle)
    np.testing.assert_array_equal(ref.outputs["policy"]["action"], result.reference.outputs["policy"]["action"])
    assert (ref.seed, ref.episodes) == (FAST["seed"], FAST["episodes"])
    # The deploy side: MindSpore made unimportable, the golden file is the reference.
    code = (
        "import sys; sys.modules['mindspore'] = None\n"
        "from msrl_consistency.verify import main\n"
        f"sys.exit(main(['--bundle', {str(cartpole_bundle.root)!r}, '--golden', {str(golden)!r}, "
        f"'--runtimes', 'onnxruntime,lite', '--out', {str(tmp_path / 'r')!r}, '--quiet']))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["reference"] == "golden:golden.npz"
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(b"not a zip")
    with pytest.raises(UsageError, match="not a golden file"):
        load_golden(corrupt, cartpole_bundle)


def test_baseline_regression_is_detected(cartpole_bundle, cartpole_ckpt, tmp_path):
    from msrl_consistency.report.baseline import check_baseline, save_baseline

    result = verify_run(cartpole_bundle, cartpole_ckpt, VerifyOptions(**FAST, runtimes=("onnxruntime",)))
    save_baseline(tmp_path / "baseline.json", result, margin_abs=0.0, margin_rel=0.0)
    assert check_baseline(tmp_path / "baseline.json", result).status == "pass"
    data = json.loads((tmp_path / "baseline.json").read_text())
    key = next(k for k in data["metrics"] if k.endswith("logits.max_abs") and data["metrics"][k]["value"] > 0)
    data["metrics"][key]["value"] /= 10
    (tmp_path / "baseline.json").write_text(json.dumps(data))
    check = check_baseline(tmp_path / "baseline.json", result)
    assert check.status == "fail" and key in check.summary


def test_cli_exit_codes(cartpole_bundle, cartpole_ckpt, tmp_path):
    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "msrl_consistency.verify", *args], capture_output=True, text=True, timeout=600
        )

    ok = run(
        "--mindir",
        str(cartpole_bundle.root / "policy.mindir"),
        "--ckpt",
        str(cartpole_ckpt),
        "--observations",
        "500",
        "--episodes",
        "2",
        "--runtimes",
        "ms-mindir",
        "--out",
        str(tmp_path / "ok"),
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert (tmp_path / "ok" / "report.md").exists()
    missing = run("--mindir", str(tmp_path / "nope.mindir"))
    assert missing.returncode == 2 and missing.stderr.strip().startswith("error:")
    required = run(
        "--bundle",
        str(cartpole_bundle.root),
        "--ckpt",
        str(cartpole_ckpt),
        "--runtimes",
        "lite-python",
        "--require",
        "lite-python",
        "--observations",
        "100",
        "--episodes",
        "1",
        "--out",
        str(tmp_path / "r"),
    )
    assert required.returncode == 3, required.stderr[-2000:]
    ascend = run("--bundle", str(cartpole_bundle.root), "--ckpt", str(cartpole_ckpt), "--device", "ascend")
    assert ascend.returncode == 3 and "no Ascend backend" in ascend.stderr
