"""Proof that the gate works: a genuine export passes; each injected fault fails with the right diagnosis."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from inference.compare.golden import load_golden, save_golden
from inference.compare.verifier import VerifyOptions
from inference.errors import UsageError
from inference.report.writers import write_reports
from inference.runtimes.base import RuntimeSource
from inference.runtimes.registry import create
from msrl_consistency.api import export_run, verify_run
from msrl_consistency.artifacts.bundle import ExportOptions

FAST = dict(observations=800, episodes=2, seed=3)


def stages(result) -> set[str]:
    return {c.diagnosis["stage"] for c in result.failed if c.diagnosis}


@pytest.mark.slow
def test_genuine_export_passes_and_writes_reports(cartpole_bundle, cartpole_ckpt, tmp_path, monkeypatch):
    from mindspore import nn

    compiled = Counter()
    original = nn.Cell.compile

    def counting(cell, *args, **kwargs):
        compiled[(type(cell).__name__, tuple(getattr(a, "shape", None) for a in args))] += 1
        return original(cell, *args, **kwargs)

    monkeypatch.setattr(nn.Cell, "compile", counting)
    result = verify_run(cartpole_bundle, cartpole_ckpt, VerifyOptions(**FAST))
    assert result.exit_code == 0, [c.summary for c in result.failed]
    # The compiled twin that played the reference episodes is the ms-graph runtime: no Cell compiled twice per shape.
    assert compiled and max(compiled.values()) == 1, compiled
    ran = {n for n, info in result.runtimes.items() if info["status"] == "ran"}
    assert {"ms-graph", "ms-mindir", "onnxruntime"} <= ran
    assert not {"lite-aarch64", "lite-aarch64-fp16"} & set(result.runtimes)  # emulated: run only when named
    names = {(c.runtime, c.name) for c in result.checks}
    assert ("ms-mindir", "episodes.free_running.stochastic") in names
    assert ("env", "env_determinism") in names
    paths = write_reports(result, tmp_path / "report")
    report = json.loads(paths["json"].read_text())
    assert report["schema"] == "msrl-consistency/verify-report" and report["passed"] and report["schema_version"] == 2
    assert "<testsuite" in paths["junit"].read_text() and paths["plot"].stat().st_size > 1000
    logits = next(c for c in report["checks"] if c["runtime"] == "ms-mindir" and c["name"] == "observations.policy")
    assert logits["metrics"]["argmax"]["flips"] == 0 and logits["metrics"]["outputs"]["logits"]["max_abs"] == 0.0
    # The tolerance each runtime was granted is in the report, as the rule ONNX Runtime's error was measured for.
    ort = report["runtimes"]["onnxruntime"]["tolerance"]["logits"]
    assert ort["rule"] == "atol 1e-05 + 0.0002 x row max|ref|, rtol 0.0001", ort
    assert "tolerance atol 1e-05 + 0.0002 x row max|ref|" in paths["md"].read_text()


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


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize("env", ["cartpole", "pendulum"])
def test_fp16_bundle_passes_its_preset_on_every_runtime(request, env, tmp_path):
    """What the fp16 preset promises: outputs within 1e-2, action flips only at near-ties, the same returns."""
    ckpt = request.getfixturevalue(f"{env}_ckpt")
    bundle = export_run(ckpt, tmp_path / "fp16", ExportOptions(precision="fp16"))
    result = verify_run(bundle, ckpt, VerifyOptions(observations=2000, episodes=4, seed=3))
    assert result.ok, result.console_table(only_failed=True)
    assert {"ms-mindir", "lite"} <= {n for n, info in result.runtimes.items() if info["status"] == "ran"}
    flips = [c.metrics["flips"] for c in result.checks if "flips" in c.metrics]
    assert all(f["ok"] and f["explained"] == f["flips"] for f in flips)


@pytest.mark.slow
def test_fp16_preset_still_fails_a_real_fault(pendulum_ckpt, tmp_path):
    bundle = faulty_bundle(pendulum_ckpt, tmp_path / "bundle", _no_scaling, precision="fp16")
    result = verify_run(bundle, pendulum_ckpt, VerifyOptions(**FAST, runtimes=("ms-mindir",)))
    assert result.exit_code == 1 and "postprocessing" in stages(result), result.console_table()


def test_a_flip_is_judged_against_the_tolerance_granted_to_the_scores():
    """Under every preset: a flip is forgiven exactly when the two scores may move that far within the tolerance
    their output is granted (atol of the row, which grows with the row's magnitude, or rtol), and rarely."""
    from inference.bundle.contract import PolicyContract
    from inference.compare.judge.stats import PRESETS, Tolerance
    from inference.compare.runtime_check import judge_flips

    contract = PolicyContract.from_dict({"input": {"obs": [2]}, "outputs": {"names": ["logits"]},
                                         "action": {"kind": "categorical", "logits": "logits"}})  # fmt: skip
    fp16, fp32 = PRESETS["fp16"], PRESETS["fp32"]

    def verdict(ref_row, got_row, preset, tol, rows=1000, flips=1, row_atol=None):
        ref = np.tile([[1.0, 0.0]], (rows, 1)).astype(np.float32)
        got = ref.copy()
        ref[:flips], got[:flips] = ref_row, got_row
        atol = None if row_atol is None else {"logits": row_atol}
        return judge_flips(contract, {"logits": ref}, {"logits": got}, None, preset, {"logits": tol}, None, atol)[0]

    near, swapped = [0.5, 0.499], [0.499, 0.5]  # margin 1e-3
    assert verdict(near, swapped, fp16, fp16.tolerance)["ok"]  # fp16 lets each score move 5e-3 (1% of 0.5)
    assert not verdict(near, swapped, fp32, fp32.tolerance)["ok"]  # fp32: 1e-4 each, 2e-4 < 1e-3
    tie = verdict([0.5, 0.49995], [0.49995, 0.5], fp32, fp32.tolerance)  # margin 5e-5 <= 2e-4: fp32 forgives it
    assert tie["ok"] and tie["explained"] == tie["flips"] == 1
    assert not verdict([0.9, 0.1], [0.1, 0.9], fp16, fp16.tolerance)["ok"]  # margin 0.8: not a near-tie
    many = verdict(near, swapped, fp16, fp16.tolerance, flips=10)  # 1% of the rows, each a near-tie
    assert many["explained"] == 10 and not many["ok"]  # over the 0.5% rate the preset allows
    # The atol a runtime grants grows with the row's magnitude (scale): a flip within that grant is forgiven (logits
    # of a row of magnitude 3.4 may each move by 3.5e-2 under fp16; a 6.2e-3 margin is within it), one beyond not.
    grown = Tolerance(1e-3, 1e-2, scale=1e-2)
    row = [0.2, 0.2 - 6.2e-3]
    assert verdict(row, row[::-1], fp16, grown, row_atol=np.full(1000, 1e-3 + 1e-2 * 3.4))["ok"]
    assert not verdict(row, row[::-1], fp16, grown, row_atol=np.full(1000, 1e-3))["ok"]  # 2 x 2e-3 < 6.2e-3


def test_returns_rule_of_the_fp16_preset():
    from inference.compare.episodes.checks import returns_check
    from inference.compare.judge.stats import PRESETS, ks_two_sample

    fp16 = PRESETS["fp16"]
    ref = np.full(20, 500.0)
    same = np.r_[np.full(19, 500.0), 480.0]  # one episode fell a bit earlier: the task is solved as well
    worse = np.r_[np.full(10, 500.0), np.full(10, 200.0)]
    assert returns_check("rt", "x", "", {}, ref, same, fp16).status == "pass"
    assert returns_check("rt", "x", "", {}, ref, worse, fp16).status == "fail"
    # A chaotic env: paired episodes part ways and their returns scatter. A mean beyond the bound that is within the
    # noise of three episodes cannot be judged: not a pass but an error (exit 3) naming the episodes that would decide;
    # the same shift steady is a failure, and so is any shift beyond 4x the bound, however noisy.
    scattered_ref, scattered = np.array([-80.0, 10.0, -20.0]), np.array([-86.0, 12.0, -23.0])  # moved 2.3, bound 1.9
    check = returns_check("rt", "x", "", {}, scattered_ref, scattered, fp16)
    assert check.status == "error" and "within the noise of 3 paired episodes" in check.summary, check.summary
    assert check.metrics["episodes_to_decide"] > 3 and f"about {check.metrics['episodes_to_decide']} episodes" in \
        check.summary  # fmt: skip
    steady = returns_check("rt", "x", "", {}, np.full(20, -30.0), np.full(20, -39.4), fp16)
    assert steady.status == "fail"
    far = returns_check("rt", "x", "", {}, scattered_ref, np.array([-120.0, 15.0, -18.0]), fp16)  # 29% of the scale
    assert far.status == "fail" and far.metrics["mean_return_noise"] > abs(far.metrics["mean_return"] + 30)
    from scipy import stats as scipy_stats  # a dev dependency

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=30), rng.normal(0.8, size=30)
    assert ks_two_sample(a, b)[0] == pytest.approx(scipy_stats.ks_2samp(a, b).statistic)
    assert abs(ks_two_sample(a, b)[1] - scipy_stats.ks_2samp(a, b, method="asymp").pvalue) < 0.05


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_bundle_from_another_checkpoint_is_a_provenance_fault(cartpole_bundle, tmp_path):
    from conftest import train_tiny

    other = train_tiny(tmp_path / "other", "CartPole-v1", seed=7)
    result = verify_run(cartpole_bundle, other, VerifyOptions(**FAST, runtimes=("ms-mindir",)))
    assert result.exit_code == 1
    provenance = next(c for c in result.checks if c.name == "provenance")
    assert provenance.status == "fail" and "different checkpoint" in provenance.summary
    assert stages(result) == {"provenance"}


@pytest.mark.slow
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
    from inference.report.baseline import check_baseline, save_baseline

    result = verify_run(cartpole_bundle, cartpole_ckpt, VerifyOptions(**FAST, runtimes=("onnxruntime",)))
    save_baseline(tmp_path / "baseline.json", result, margin_abs=0.0, margin_rel=0.0)
    assert check_baseline(tmp_path / "baseline.json", result).status == "pass"
    data = json.loads((tmp_path / "baseline.json").read_text())
    key = next(k for k in data["metrics"] if k.endswith("logits.max_abs") and data["metrics"][k]["value"] > 0)
    data["metrics"][key]["value"] /= 10
    (tmp_path / "baseline.json").write_text(json.dumps(data))
    check = check_baseline(tmp_path / "baseline.json", result)
    assert check.status == "fail" and key in check.summary


@pytest.mark.slow
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


def test_a_device_mindspore_cannot_reach_is_unavailable(cartpole_bundle, cartpole_ckpt, monkeypatch, tmp_path):
    """Whatever this machine has: a backend MindSpore reports missing makes the reference unavailable (exit 3).
    (Lite is left out: on Ascend it needs a bundle with a precision mode, refused before as bad input.)"""
    import mindspore as ms

    from inference.errors import describe
    from msrl_consistency import verify

    monkeypatch.setattr(ms.hal, "is_available", lambda target: target == "CPU")
    args = ["--bundle", str(cartpole_bundle.root), "--ckpt", str(cartpole_ckpt), "--device", "ascend", "--runtimes",
            "ms-mindir", "--out", str(tmp_path / "r"), "--quiet"]  # fmt: skip
    with pytest.raises(Exception) as info:
        verify.main(args)
    message, code = describe(info.value)
    assert code == 3 and "no Ascend backend" in message


@pytest.mark.slow
@pytest.mark.parametrize("env", ["cartpole", "pendulum"])
def test_teacher_forcing_in_large_batches_equals_step_by_step(request, env):
    """Teacher-forced episodes run as a few large calls: same actions as one call per step (the old way)."""
    from inference.compare import episodes as E
    from inference.compare.acting import mode_policy

    bundle, ckpt = request.getfixturevalue(f"{env}_bundle"), request.getfixturevalue(f"{env}_ckpt")
    ref = verify_run(bundle, ckpt, VerifyOptions(**FAST, runtimes=("onnxruntime",))).reference
    source = RuntimeSource(bundle)
    runtimes = {g: create("onnxruntime", source, g).open() for g in bundle.graphs}
    try:
        for mode, trace in ref.traces.items():
            policy, noise = mode_policy(bundle, runtimes, mode), ref.episode_noise.get(mode)
            batched, states = E.teacher_forced_actions(trace, policy, noise)
            assert states is None  # no carried state: the whole trace in large calls
            steps = range(len(trace.obs))
            stepwise = np.stack([policy.act(trace.obs[t], None if noise is None else noise[t]) for t in steps])
            assert batched.shape == stepwise.shape
            np.testing.assert_allclose(batched, stepwise, rtol=0, atol=1e-6)
            if env == "cartpole":
                np.testing.assert_array_equal(batched, stepwise)
    finally:
        for rt in runtimes.values():
            rt.close()


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_free_running_that_follows_the_reference_gives_the_same_trace(env_id):
    """Skipping env steps while actions equal the reference's bit for bit changes nothing but the cost."""
    from inference.compare import episodes as E

    made = []
    base = E.gym_env_source(env_id)
    env = E.EnvSource(env_id, lambda: made.append(1) or base.make(), base.max_steps)
    discrete = env_id == "CartPole-v1"

    def reference(obs, _noise):
        return (obs[:, 2] > 0).astype(np.int64) if discrete else np.clip(-obs[:, 2:3], -2, 2).astype(np.float32)

    def drifting(obs, noise):  # acts like the reference until an episode's first observation crosses a threshold
        action = reference(obs, noise)
        off = np.abs(obs[:, 1]) > (0.3 if discrete else 0.9)
        if discrete:
            action[off] = 1 - action[off]
        else:
            action[off] += np.float32(1e-4)
        return action

    from inference.bundle.contract import PolicyContract

    action = {"kind": "argmax", "values": "q"} if discrete else {"kind": "deterministic", "action": "q"}
    contract = PolicyContract.from_dict({"input": {"obs": [4 if discrete else 3]}, "outputs": {"names": ["q"]},
                                         "action": action})  # fmt: skip

    class Acting:  # a policy as run_episodes drives one: act, reset, the state it carries (none)
        def __init__(self, fn):
            self.fn, self.contract, self.state = fn, contract, None

        def reset(self, batch):
            pass

        def act(self, obs, noise):
            return self.fn(obs, noise)

    ref = E.run_episodes(env, Acting(reference), 4, 7, None)
    made.clear()
    same = E.run_episodes(env, Acting(reference), 4, 7, None, follow=ref)
    assert not made  # no env was stepped: every action equalled the reference's
    full = E.run_episodes(env, Acting(drifting), 4, 7, None)
    fast = E.run_episodes(env, Acting(drifting), 4, 7, None, follow=ref)
    assert not np.array_equal(full.actions[: len(ref.actions)], ref.actions[: len(full.actions)])
    for want, got in ((ref, same), (full, fast)):
        np.testing.assert_array_equal(got.alive, want.alive)
        np.testing.assert_array_equal(got.rewards, want.rewards)
        np.testing.assert_array_equal(got.obs[got.alive], want.obs[want.alive])
        np.testing.assert_array_equal(got.actions[got.alive], want.actions[want.alive])


@pytest.mark.slow
def test_an_fp16_sampling_graph_transforms_its_noise_in_float32(cartpole_ckpt, tmp_path):
    """In fp16 the uniform clamp 1 - 1e-6 is 1.0: draws above ~0.99976 became infinite Gumbel samples and the first
    such entry won whatever the logits. The fp16 graph keeps the noise and its transform in float32."""
    from inference.bundle.contract import gumbel_argmax

    bundle = export_run(cartpole_ckpt, tmp_path / "fp16", ExportOptions(precision="fp16", formats=("mindir",)))
    obs = np.zeros((64, 4), np.float32)
    noise = np.tile(np.float32([0.9999, 0.999999]), (64, 1))  # both 1.0 in fp16; Gumbel 9.2 vs 13.8 in float32
    with create("ms-mindir", RuntimeSource(bundle), "policy_sample") as rt:
        out = rt.infer(obs, noise)
    np.testing.assert_array_equal(out["action"], gumbel_argmax(out["logits"], noise))
    assert (out["action"] == 1).all()  # the float32 transform's winner (equal logits up to a few units)


def test_a_flipped_sample_counts_once_as_the_flip(cartpole_bundle, cartpole_ckpt):
    """The log-prob of a flipped sampled action is the flip's consequence: one finding, not two."""
    from inference.compare.feeds import seeded_feeds
    from inference.compare.judge.stats import PRESETS, tolerance_for
    from inference.compare.reference import Reference
    from inference.compare.runtime_check import _compare_outputs
    from msrl_consistency.artifacts.cells import TrainerCells

    feeds = seeded_feeds(cartpole_bundle, 256, 0)
    source = RuntimeSource(cartpole_bundle, TrainerCells(cartpole_ckpt, cartpole_bundle.policy_spec))
    with create("ms-graph", source, "policy_sample") as rt:
        outputs = rt.infer(*feeds.graph_inputs(cartpole_bundle, "policy_sample"))
    ref = Reference(feeds, {"policy_sample": outputs}, {}, {}, 0, 0)
    got = {k: v.copy() for k, v in outputs.items()}
    got["action"][0] = 1 - got["action"][0]
    got["log_prob"][0] -= 2.0
    tol = {k: tolerance_for("fp32", "lite") for k in got}
    check, cmps = _compare_outputs("lite", "policy_sample", cartpole_bundle, ref, got, tol, PRESETS["fp32"])
    assert check.status == "fail" and cmps["log_prob"].passed
    assert check.summary.startswith("outputs agree, actions do not: 1 action flip(s) of 256"), check.summary
