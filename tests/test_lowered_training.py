"""Training in the device's numerics (``train --lower``): the straight-through gradients, the int8 scheme against
Lite's own arithmetic, the configuration's refusals, and a run fine-tuned in int8 and in fp16 that exports and
verifies against its own lowered Cell."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import lite_build
import mindspore as ms
import numpy as np
import pytest
from cli_inprocess import run_module
from conftest import TINY_RUN, run_trainer

from inference.errors import UsageError
from msrl_consistency import compat
from msrl_consistency.agent import lowered
from msrl_consistency.agent.networks import MLP
from msrl_consistency.config import TrainConfig

REPO = Path(__file__).resolve().parents[1]


def _mlp(lower: str) -> MLP:
    mlp = MLP(np.random.default_rng(3), 3, [5], 2, "tanh", out_gain=1.0, lower=lower)
    if lower == "int8":
        lowered.set_ranges(mlp, np.array([[-2, 2], [-3, 3], [-1, 1], [-1.5, 1.5]], np.float32))
    return mlp


def _surrogate(mlp: MLP, x: np.ndarray, weights: list[np.ndarray], replay: list | None, record: list) -> np.ndarray:
    """The trunk's lowered forward in NumPy with every rounding either recorded (its residual, whether it passes a
    gradient, its value) or replayed as ``v + residual`` (a clamped int8 value stays constant): the function whose
    gradient the straight-through estimator is, at the recorded point."""
    steps = iter(replay) if replay is not None else None

    def q(v: np.ndarray, rounded: np.ndarray, inside: np.ndarray | bool = True) -> np.ndarray:
        if steps is None:
            record.append((rounded - v, np.broadcast_to(inside, v.shape), rounded))
            return rounded
        residual, passes, value = next(steps)
        return np.where(passes, v + residual, value)

    def fp16(v: np.ndarray) -> np.ndarray:
        return v.astype(np.float16).astype(np.float64)

    def act(v: np.ndarray, t: int) -> np.ndarray:
        lo, hi = (min(float(r), 0.0) if k == 0 else max(float(r), 0.0) for k, r in enumerate(mlp.ranges.asnumpy()[t]))
        scale = (hi - lo) / 255
        zero = -128 - np.sign(lo / scale) * np.floor(abs(lo / scale) + 0.5)
        code = np.clip(np.sign(v / scale + zero) * np.floor(np.abs(v / scale + zero) + 0.5), -128, 127)
        return q(v, (code - zero) * scale, (code > -128) & (code < 127))

    h = x.astype(np.float64)
    for k in range(2):
        w, b = weights[2 * k], weights[2 * k + 1]
        if mlp.lower == "fp16":
            h = q(h, fp16(h))
            y = h @ q(w, fp16(w)).T + q(b, fp16(b))
            h = q(y, fp16(y))
        else:
            h = act(h, 2 * k)
            s_in = (max(float(mlp.ranges.asnumpy()[2 * k, 1]), 0) - min(float(mlp.ranges.asnumpy()[2 * k, 0]), 0)) / 255
            s_w = np.abs(w).max(1, keepdims=True) / 127
            wq = np.clip(np.sign(w / s_w) * np.floor(np.abs(w / s_w) + 0.5), -127, 127) * s_w
            bs = s_in * s_w[:, 0]
            y = h @ q(w, wq).T + q(b, np.sign(b / bs) * np.floor(np.abs(b / bs) + 0.5) * bs)
            h = act(y, 2 * k + 1)
        if k == 0:
            h = np.tanh(h)
            h = q(h, fp16(h)) if mlp.lower == "fp16" else act(h, 2)
    return h


@pytest.mark.parametrize("lower", ["fp16", "int8"])
def test_straight_through_gradients_are_the_finite_differences_of_the_rounding_frozen_forward(lower):
    mlp = _mlp(lower)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 3)).astype(np.float32) * 1.5
    g = rng.standard_normal((16, 2))
    params = [mlp.layers[0].weight, mlp.layers[0].bias, mlp.layers[2].weight, mlp.layers[2].bias]

    def loss(inp):
        return (lowered.forward(mlp, inp) * ms.Tensor(g.astype(np.float32))).sum()

    with compat.execution_mode(graph=False):
        grads = ms.grad(loss, grad_position=None, weights=params)(ms.Tensor(x))
    weights = [p.asnumpy().astype(np.float64) for p in params]
    record: list = []
    base = _surrogate(mlp, x, weights, None, record)
    with compat.execution_mode(graph=False):
        same = np.isclose(base, lowered.forward(mlp, ms.Tensor(x)).asnumpy(), atol=2e-3)
    assert same.mean() > 0.9  # the same forward (a rounding boundary may fall either way in float32 and float64)
    clamped = sum(int((~passes).sum()) for _, passes, _ in record)
    assert lower == "fp16" or clamped > 0  # the int8 case exercises the clamp's zero gradient too
    eps = 1e-6
    for p, (w, grad) in enumerate(zip(weights, grads, strict=True)):
        fd = np.zeros_like(w)
        for idx in np.ndindex(w.shape):
            shifted = [v.copy() for v in weights]
            shifted[p][idx] += eps
            up = (g * _surrogate(mlp, x, shifted, record, [])).sum()
            shifted[p][idx] -= 2 * eps
            down = (g * _surrogate(mlp, x, shifted, record, [])).sum()
            fd[idx] = (up - down) / (2 * eps)
        np.testing.assert_allclose(grad.asnumpy(), fd, rtol=2e-3, atol=2e-4, err_msg=f"{lower} parameter {p}")


def test_lites_tanh_reaches_one_and_calibration_gives_the_saturated_range_exactly():
    x = np.array([-30.0, -4.98, 0.0, 0.5, 4.98, 30.0], np.float32)
    got = lowered.lite_tanh(x)
    assert got[0] == -1.0 and got[-1] == 1.0 and got[4] == 1.0 and got[2] == 0.0
    assert abs(got[3] - np.tanh(0.5)) < 1e-6
    assert np.tanh(np.float32(5.0)) < 1.0  # NumPy's stops short of it
    weights = [(np.full((2, 1), 100.0, np.float32), np.zeros(2, np.float32)), (np.ones((1, 2), np.float32),
               np.zeros(1, np.float32))]  # fmt: skip
    ranges = lowered.activation_ranges(weights, np.array([[-1.0], [1.0]], np.float32), tanh=True)
    assert ranges[2].tolist() == [-1.0, 1.0]  # the saturated activation: exactly Lite's calibrated range


def test_snapped_weights_are_on_their_own_grid():
    w = np.random.default_rng(1).standard_normal((4, 7)).astype(np.float32)
    snapped = lowered.snap_weights(w)
    scale = np.abs(snapped).max(1, keepdims=True) / 127
    codes = snapped / scale
    assert np.allclose(codes, np.round(codes), atol=1e-3) and np.abs(codes).max() <= 127 + 1e-3
    assert np.allclose(lowered.snap_weights(snapped), snapped, rtol=1e-6, atol=0)  # snapping again changes nothing


@pytest.mark.parametrize(("change", "message"), [
    ({"keep": ["actor.layers.0"]}, "--keep names layers kept in fp32 under --lower"),
    ({"lower": "int4"}, "--lower must be one of fp32, int8, fp16"),
    ({"lower": "int8", "keep": ["critic.layers.0"]}, "not an actor layer"),
    ({"lower": "int8", "keep": ["actor.layers.9"]}, "not an actor layer"),
    ({"lower": "int8", "workers": 2}, "--lower trains one process"),
    ({"lower": "fp16", "update_precision": "fp16"}, "--lower trains one process"),
])  # fmt: skip
def test_the_lowered_configuration_refuses_what_it_cannot_train(change, message):
    with pytest.raises(UsageError, match=message):
        dataclasses.replace(TrainConfig(), **change).validate()


def test_init_from_refuses_another_architecture(cartpole_ckpt, tmp_path):
    cfg = TrainConfig(env_id="Pendulum-v1", total_steps=64, init_from=str(cartpole_ckpt.parent), lower="fp16",
                      **TINY_RUN)  # fmt: skip
    with pytest.raises(UsageError, match="--init-from .*lacks log_std"):
        run_trainer(cfg, tmp_path / "run")
    assert not (tmp_path / "run" / "checkpoint.ckpt").exists()


def _played_return(bundle: Path) -> float:
    """The deterministic mean return of ``bundle`` played on the deploy side (Lite), seeds 0-9."""
    proc = run_module("inference.play", str(bundle), "--episodes", "10", cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("mean return"))
    return float(line.split()[2])


def _fine_tune(start: Path, lower: str, run_dir: Path, keep: tuple[str, ...] = ()) -> dict:
    cfg = TrainConfig(env_id="CartPole-v1", seed=2, total_steps=256, lower=lower, init_from=str(start.parent),
                      learning_rate=1e-5, keep=list(keep), **{**TINY_RUN, "eval_episodes": 3})  # fmt: skip
    run_trainer(cfg, run_dir)
    return json.loads((run_dir / "run.json").read_text())


@pytest.mark.slow
@pytest.mark.skipif(not lite_build.BUILT and not lite_build.required(), reason=lite_build.WHY_NOT)
def test_an_int8_fine_tuned_run_exports_its_trained_scales_and_verifies_against_its_own_cell(
    cartpole_ckpt, cartpole_bundle, tmp_path
):
    run = tmp_path / "int8"
    info = _fine_tune(cartpole_ckpt, "int8", run)
    assert info["policy_spec"]["lower"] == "int8" and info["precision"]["actor"]["computes_in"] == "int8"
    assert len(info["precision"]["actor"]["ranges"]) == 6 == len(info["precision"]["actor"]["scales_zero_points"])
    assert info["precision"]["started_from"]["run_dir"] == str(cartpole_ckpt.parent)
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"lowered_flip_rate", "lowered_exp_abs_log_ratio", "lowered_k3_kl"} <= set(header)
    bundle = tmp_path / "bundle"
    proc = run_module("msrl_consistency.export", "--ckpt", str(run), "--out", str(bundle), cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    plan = json.loads((bundle / "manifest.json").read_text())["plan"]
    assert plan["lower"] == "int8" and plan["trained"]["computes_in"] == "int8"
    assert not [k for k in plan["kept"] if k.startswith("actor.")]  # nothing of the actor kept in fp32
    assert {layer["scope"] for layer in plan["layers"] if layer["precision"] == "int8"} == {
        f"actor.layers.{i}" for i in range(5)
    }
    for check in plan["trained"]["ranges_check"].values():  # Lite calibrated the ranges it was trained with
        assert check["tensors"] == 6 and check["max_scale_rel_diff"] < 1e-5
    from inference.lite.client import LiteRunner
    from msrl_consistency.artifacts.cells import TrainerCells

    cell = TrainerCells(run / "checkpoint.ckpt", info["policy_spec"]).lowered("policy")
    cell.set_train(False)
    x = (np.random.default_rng(4).standard_normal((2000, 4)) * [1, 1, 0.1, 1]).astype(np.float32)
    with compat.execution_mode(graph=False):
        want = cell(ms.Tensor(x))[1].asnumpy()
    runner = LiteRunner(bundle / "policy.ms", timeout=120)
    try:
        got = runner.infer(x)["logits"]
    finally:
        runner.close()
    assert (np.abs(want - got).max(1) > 0).mean() < 0.01  # the same integers: a rounding boundary now and then
    fp32_size = cartpole_bundle.file("policy", "ms").stat().st_size
    assert (bundle / "policy.ms").stat().st_size < 0.8 * fp32_size
    before, after = (_played_return(b) for b in (cartpole_bundle.root, bundle))  # what each device would do
    assert abs(after - before) <= 0.1 * abs(before), (before, after)
    proc = run_module("msrl_consistency.verify", "--bundle", str(bundle), "--ckpt", str(run), "--runtimes",
                      "lite,onnxruntime", "--observations", "600", "--episodes", "3", "--out", str(tmp_path / "r"),
                      cwd=REPO, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["runtimes"]["lite"]["reference"].startswith("ms-cell in int8")
    assert "reference" not in report["runtimes"]["onnxruntime"]  # the float graphs: against the frozen float Cell


@pytest.mark.slow
@pytest.mark.skipif(not lite_build.BUILT and not lite_build.required(), reason=lite_build.WHY_NOT)
def test_an_int8_run_keeping_its_last_layer_in_fp32_exports_and_verifies(cartpole_ckpt, tmp_path):
    """The kept Dense stays float in the .ms and in training (its own weights in calibration); the scales of the
    lowered Dense layers' inputs and outputs are the trained ones; verify passes against the trained Cell."""
    run = tmp_path / "keep"
    _fine_tune(cartpole_ckpt, "int8", run, keep=("actor.layers.4",))
    bundle = tmp_path / "bundle"
    proc = run_module("msrl_consistency.export", "--ckpt", str(run), "--out", str(bundle), cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    plan = json.loads((bundle / "manifest.json").read_text())["plan"]
    assert "actor.layers.4" in plan["kept"] and "actor.layers.2" not in plan["kept"]
    assert all(c["tensors"] == 4 and c["max_scale_rel_diff"] < 1e-5 for c in plan["trained"]["ranges_check"].values())
    proc = run_module("msrl_consistency.verify", "--bundle", str(bundle), "--ckpt", str(run), "--runtimes", "lite",
                      "--observations", "600", "--episodes", "3", "--out", str(tmp_path / "r"), cwd=REPO,
                      timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


@pytest.mark.slow
def test_an_fp16_fine_tuned_run_verifies_on_the_emulation_against_its_own_cell(cartpole_ckpt, tmp_path):
    run = tmp_path / "fp16"
    _fine_tune(cartpole_ckpt, "fp16", run)
    bundle = tmp_path / "bundle"
    proc = run_module("msrl_consistency.export", "--ckpt", str(run), "--out", str(bundle), "--formats", "onnx",
                      cwd=REPO, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    plan = json.loads((bundle / "manifest.json").read_text())["plan"]
    assert plan["lower"] == "fp16" and not [k for k in plan["kept"] if k.startswith("actor.")]
    proc = run_module("msrl_consistency.verify", "--bundle", str(bundle), "--ckpt", str(run), "--runtimes",
                      "onnxruntime", "--emulate", "fp16", "--observations", "600", "--episodes", "3", "--out",
                      str(tmp_path / "r"), cwd=REPO, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["runtimes"]["emulated-fp16"]["reference"].startswith("ms-cell in fp16")


def _gemmlowp(acc: int, multiplier: float) -> int:
    """gemmlowp's requantization in Python integers: QuantizeMultiplier, SaturatingRoundingDoublingHighMul and
    RoundingDivideByPOT, as Lite's int8 MatMul calls them."""
    import math

    frac, e = math.frexp(multiplier)
    q = int(math.floor(frac * 2**31 + 0.5))
    if q == 2**31:
        q, e = q // 2, e + 1
    ab = (acc << max(e, 0)) * q
    s = ab + ((1 << 30) if ab >= 0 else 1 - (1 << 30))
    high = s // 2**31 if s >= 0 else -((-s) // 2**31)
    right = max(-e, 0)
    mask = (1 << right) - 1
    return (high >> right) + int((high & mask) > (mask >> 1) + int(high < 0))


def test_the_fixed_point_rescale_is_gemmlowps_to_the_integer():
    rng = np.random.default_rng(5)
    acc = rng.integers(-4_000_000, 4_000_000, (64, 9)).astype(np.float64)
    acc[0, :3] = [0, 1, -1]
    multipliers = np.array([3.1e-4, 0.0123, 0.5, 0.25, 1.0, 1.7, 2.0**-20, 0.0078125, 0.999999], np.float64)
    with compat.execution_mode(graph=False):
        got = lowered.fixed_point(ms.Tensor(acc), ms.Tensor(multipliers)).asnumpy()
    want = np.array([[_gemmlowp(int(a), float(m)) for a, m in zip(row, multipliers, strict=True)] for row in acc])
    assert np.array_equal(got, want)
    assert not np.array_equal(want, np.sign(acc * multipliers) * np.floor(np.abs(acc * multipliers) + 0.5))  # not float


@pytest.mark.slow
def test_an_int8_run_resumed_after_a_crash_is_bitwise_the_uninterrupted_one(tmp_path):
    from msrl_consistency.artifacts.checkpoint import read_checkpoint

    cfg = TrainConfig(env_id="CartPole-v1", total_steps=512, lower="int8", **{**TINY_RUN, "checkpoint_every": 2})
    run_trainer(cfg, tmp_path / "whole")
    run_trainer(cfg, tmp_path / "crashed", stop_at=5)
    run_trainer(cfg, tmp_path / "crashed", resume=True)
    whole, resumed = (read_checkpoint(tmp_path / d / "checkpoint.ckpt") for d in ("whole", "crashed"))
    assert {"actor.ranges", "calibration"} <= set(whole)  # the ranges and the rows they come from are checkpointed
    assert all(np.array_equal(whole[k].asnumpy(), resumed[k].asnumpy()) for k in whole)


def test_a_kept_layer_is_calibrated_and_computed_with_its_own_weights():
    rng = np.random.default_rng(2)
    weights = [
        (rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal(5).astype(np.float32)),
        (rng.standard_normal((2, 5)).astype(np.float32), rng.standard_normal(2).astype(np.float32)),
    ]
    x = rng.standard_normal((50, 3)).astype(np.float32)
    snapped, kept = (lowered.activation_ranges(weights, x, tanh=True, kept=k) for k in ((), (1,)))
    assert np.array_equal(snapped[:3], kept[:3]) and not np.array_equal(snapped[3], kept[3])  # layer 1's output
    mlp = MLP(np.random.default_rng(3), 3, [5], 2, "tanh", out_gain=1.0, lower="int8", keep=(2,))
    lowered.set_ranges(mlp, kept)
    h = ms.Tensor(x)
    with compat.execution_mode(graph=False):
        out = lowered.forward(mlp, h).asnumpy()
        hidden = mlp.layers[1](lowered._dense(mlp, mlp.layers[0], h, 0, False))  # int8 Dense, float Tanh
        want = ms.ops.dense(hidden, mlp.layers[2].weight, mlp.layers[2].bias).asnumpy()  # the kept Dense: float
    assert np.allclose(out, want, atol=1e-6)


def test_the_int8_forward_computes_lites_own_tanh_in_graph_and_pynative():
    x = np.linspace(-12, 12, 200_001).astype(np.float32)
    with compat.execution_mode(graph=False):
        got = lowered.lite_tanh_graph(ms.Tensor(x)).asnumpy()
    assert np.array_equal(got, lowered.lite_tanh(x))
    assert not np.array_equal(got, np.tanh(x))  # the point: MindSpore's and NumPy's tanh are not Lite's
