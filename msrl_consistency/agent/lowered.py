"""The actor trunk computed in the device's numerics (``int8`` or ``fp16``), with straight-through gradients.

A policy trained with ``--lower`` runs this forward in its rollouts and in its PPO update, so the policy that was
trained is the policy the device runs:

* ``fp16``: every float input, weight and output of each operator rounded to fp16, as the fp16 emulation rewrites the
  exported graph (``inference.runtimes.fp16_emulation``): a Dense multiplies the rounded input by the rounded weights,
  accumulates in fp32, adds the rounded bias and rounds once; an activation rounds its output.
* ``int8``: what Lite's full quantization computes (``INT8_SCHEME``, measured bit for bit on Lite 2.0.0's x86_64 CPU
  kernels): weights per output channel, symmetric; every activation tensor per tensor, asymmetric, with the range its
  calibration observed; the bias in int32 at the scale input × weight; each MatMul's integer product rescaled with
  the fixed-point multiply Lite's kernels use; the activation between a dequantize and a quantize.

The rounding is forwarded and the gradient passes straight through (``x + stop_gradient(q(x) - x)``); an int8
activation outside its range gets no gradient (its value is clamped). The ranges, and the scales and zero points they
give, are Parameters the training loop refreshes from the states the policy visits (``activation_ranges``,
``set_ranges``) and the checkpoint stores, so export calibrates Lite to the very scales the policy was trained with.

Why not MindSpore Golden Stick (``mindspore-gs`` 1.4.1, built for MindSpore 2.7.1): its SimQAT and LSQ algorithms
wrap a Cell on MindSpore 2.10, but their kernels (``FakeQuantPerLayer``, ``FakeLearnedScaleQuantPerLayer``) have no
CPU implementation ("Unsupported op ... on CPU"), its import needs Hugging Face ``datasets``, and it fake-quantizes by
its own rules rather than the rounding and fixed-point rescale Lite's converter and kernels apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Tensor, ops

QMIN, QMAX = -128, 127  # int8 activations
WMAX = 127  # int8 weights: symmetric, [-127, 127]
INT8_SCHEME = {
    "weights": "per output channel, symmetric: scale = max|w| / 127, integers in [-127, 127]",
    "activations": "per tensor, asymmetric: the calibration range widened to hold 0, scale = (max - min) / 255, "
    "zero point = -128 - round(min / scale), integers in [-128, 127]; calibrated on Lite's float32 graph (its "
    "Tanh saturates to exactly ±1 beyond |x| 4.97)",
    "bias": "int32 at scale = input scale × weight scale of its channel",
    "matmul": "int32 product of the codes plus the bias, rescaled by gemmlowp's fixed-point multiply and rounding "
    "shift",
    "activations_between": "Tanh and ReLU compute in float32 between a dequantize and a quantize",
    "rounding": "half away from zero",
}


def lowered_numerics(lower: str, keep: Sequence[str]) -> dict[str, Any]:
    """What run.json and the bundle's manifest record of the actor's numerics."""
    described: dict[str, Any] = {"computes_in": lower, "kept_in_fp32": list(keep)}
    if lower == "int8":
        described["int8_scheme"] = dict(INT8_SCHEME)
    if lower != "fp32":
        described["gradients"] = "straight-through"
    return described


def straight_through(x: Tensor, rounded: Tensor) -> Tensor:
    """``rounded`` forward, identity backward."""
    return x + ops.stop_gradient(rounded - x)


def round_half_away(x: Tensor) -> Tensor:
    return ops.sign(x) * ops.floor(ops.abs(x) + 0.5)


def fp16(x: Tensor) -> Tensor:
    """``x`` rounded to fp16 (kept in float32), straight through."""
    return straight_through(x, x.astype(ms.float16).astype(ms.float32))


def act_qparams(ranges: np.ndarray) -> np.ndarray:
    """[scale, zero point] of each int8 activation from its calibration range [min, max] (``INT8_SCHEME``), as Lite's
    converter computes them: the range widened to hold 0, the scale in float32, the zero point from the unrounded scale
    in float64 (a symmetric range's ``min / scale`` is then exactly -127.5, which rounds to a zero point of 0)."""
    lo = np.minimum(ranges[:, 0], 0).astype(np.float32)
    span = (np.maximum(ranges[:, 1], 0).astype(np.float32) - lo).astype(np.float32)
    ratio = lo.astype(np.float64) / np.maximum(span.astype(np.float64) / (QMAX - QMIN), 1e-12)
    zero = QMIN - np.sign(ratio) * np.floor(np.abs(ratio) + 0.5)
    return np.stack([np.maximum(span / np.float32(QMAX - QMIN), np.float32(1e-12)), zero], 1).astype(np.float32)


def set_ranges(mlp: Any, ranges: np.ndarray) -> None:
    """An int8 trunk's calibrated ranges and the quantization parameters they give (one host computation per
    calibration: the graphs read the parameters, the checkpoint keeps both)."""
    mlp.ranges.set_data(Tensor(np.asarray(ranges, np.float32)))
    mlp.qparams.set_data(Tensor(act_qparams(np.asarray(ranges, np.float32))))


def act_codes(x: Tensor, scale: Tensor, zero: Tensor) -> Tensor:
    """The int8 codes of ``x`` at ``scale`` and ``zero`` point (Lite multiplies by the reciprocal of the scale)."""
    return ops.clamp(round_half_away(x * (1.0 / scale) + zero), QMIN, QMAX)


def int8_act(x: Tensor, scale: Tensor, zero: Tensor, codes: Tensor | None = None) -> Tensor:
    """``x`` quantized to int8 with ``scale`` and ``zero`` point and dequantized, straight through inside the range;
    ``codes``: its codes when already known (the input's, or those an int8 MatMul computed: the float ``x`` then
    carries only the gradient)."""
    q = act_codes(x, scale, zero) if codes is None else codes
    inside = ops.stop_gradient(ops.logical_and(q > QMIN, q < QMAX).astype(x.dtype))
    return ops.stop_gradient((q - zero) * scale) + inside * (x - ops.stop_gradient(x))


def weight_scale(w: Tensor) -> Tensor:
    """Per output channel (row of a Dense weight) scale: max|w| / 127."""
    return ops.maximum(ops.abs(w).max(axis=1, keepdims=True) / float(WMAX), 1e-12)


def snap_weights(w: np.ndarray) -> np.ndarray:
    """A weight matrix on its int8 grid (what the device holds, dequantized): export writes these."""
    scale = np.maximum(np.abs(w).max(axis=1, keepdims=True) / WMAX, 1e-12).astype(np.float32)
    q = np.clip(np.sign(w) * np.floor(np.abs(w / scale) + 0.5), -WMAX, WMAX)
    return (q * scale).astype(np.float32)


def freeze(policy: Any) -> Any:
    """``policy`` (an ``ActorCritic``) as the float graphs export writes carry it: an int8 actor's lowered layers hold
    their int8-grid weights, and the trunk computes in float, so Lite's converter quantizes it to the same integers
    and the float runtimes run the device's weights. The calibrated ranges and rows stay for export."""
    actor = policy.actor
    if actor.lower == "int8":
        for i in actor.dense_index:
            if i not in actor.kept_index:
                layer = actor.layers[i]
                layer.weight.set_data(Tensor(snap_weights(layer.weight.asnumpy())))
    actor.lowered = False
    return policy


def forward(mlp: Any, x: Tensor) -> Tensor:
    """``mlp`` (``networks.MLP``) computed in ``mlp.lower``; layers in ``mlp.keep`` stay fp32.

    Each int8 MatMul's output codes come from Lite's fixed-point rescale, in the rollouts and in the PPO update alike:
    an update that rounded the float product instead (half the operations, the same codes but at rounding boundaries)
    fine-tuned worse (``bench/results/lowered_training.md``).

    Tensors are numbered as ``activation_ranges`` returns them: 0 the input, then each Dense's output and each
    activation's output in turn.
    """
    last = len(mlp.dense_index) - 1
    h = x
    for k, i in enumerate(mlp.dense_index):
        layer = mlp.layers[i]
        h = _dense(mlp, layer, h, k, i in mlp.kept_index)
        if k < last:
            if not mlp.tanh:
                h = ops.relu(h)
            elif mlp.lower == "int8" and i + 1 not in mlp.kept_index:
                h = straight_through(ops.tanh(h), lite_tanh_graph(h))  # Lite's own Tanh: the next code depends on it
            else:
                h = ops.tanh(h)
            if mlp.lower == "fp16" and i + 1 not in mlp.kept_index:
                h = fp16(h)  # int8: the activation computes in float; the next lowered Dense quantizes its output
    return h


def _dense(mlp: Any, layer: Any, h: Tensor, k: int, kept: bool) -> Tensor:
    if kept:
        return ops.dense(h, layer.weight, layer.bias)
    if mlp.lower == "fp16":
        return fp16(ops.dense(fp16(h), fp16(layer.weight), fp16(layer.bias)))
    t = 2 * k  # the input tensor's index: 0, or the previous activation's output
    in_scale, in_zero = mlp.qparams[t, 0], mlp.qparams[t, 1]
    out_scale, out_zero = mlp.qparams[t + 1, 0], mlp.qparams[t + 1, 1]
    # every code once: the input's, the weights' (per output channel, symmetric), the bias's (int32 at input ×
    # weight scale); the float product of their dequantized values is what the gradient follows
    x_codes = act_codes(h, in_scale, in_zero)
    w_scale = weight_scale(layer.weight)
    w_codes = ops.clamp(round_half_away(layer.weight / w_scale), -WMAX, WMAX)
    b_scale = in_scale * w_scale.squeeze(-1)
    b_codes = round_half_away(layer.bias / b_scale)
    y = ops.dense(int8_act(h, in_scale, in_zero, x_codes), straight_through(layer.weight, w_codes * w_scale),
                  straight_through(layer.bias, b_codes * b_scale))  # fmt: skip
    codes = ops.stop_gradient(_int8_matmul(x_codes - in_zero, w_codes, b_codes, in_scale, w_scale.squeeze(-1),
                                           out_scale, out_zero))  # fmt: skip
    return int8_act(y, out_scale, out_zero, codes)


def _int8_matmul(x: Tensor, w: Tensor, b: Tensor, in_scale: Tensor, w_scale: Tensor, out_scale: Tensor,
                 out_zero: Tensor) -> Tensor:  # fmt: skip
    """The output codes of Lite's int8 MatMul from the input's codes less its zero point (``x``), the weights' and
    the int32 bias's codes: their integer product plus the bias, rescaled by ``in_scale × w_scale / out_scale`` (in
    float64, as Lite) with gemmlowp's fixed-point multiply and rounding shift (``fixed_point``), plus the output's
    zero point. Exact in float64 (codes times codes summed, far below 2^53)."""
    f64 = ms.float64
    acc = ops.dense(x.astype(f64), w.astype(f64), b.astype(f64))
    multiplier = in_scale.astype(f64) * w_scale.astype(f64) / out_scale.astype(f64)
    return ops.clamp(fixed_point(acc, multiplier) + out_zero.astype(f64), float(QMIN),
                     float(QMAX)).astype(ms.float32)  # fmt: skip


def fixed_point(acc: Tensor, multiplier: Tensor) -> Tensor:
    """``acc × multiplier`` rounded as gemmlowp's requantization does (what Lite's int8 kernels call): the multiplier
    as ``q × 2^(e - 31)`` (``frexp``, ``q`` rounded to 31 bits), SaturatingRoundingDoublingHighMul by ``q``, then a
    rounding right shift by ``-e`` (half away from zero), in int64. Rounding twice is what the float product
    ``round(acc × multiplier)`` misses by one code on a few tenths of a percent of outputs."""
    f64, i64 = ms.float64, ms.int64
    e = ops.floor(ops.log2(multiplier)) + 1.0
    m = multiplier / ops.pow(2.0, e)
    e = e + (m >= 1.0).astype(f64) - (m < 0.5).astype(f64)  # log2's rounding at a power of two
    q = ops.floor(multiplier / ops.pow(2.0, e) * 2.0**31 + 0.5)
    whole = q >= 2.0**31
    q, e = ops.select(whole, q / 2.0, q), e + whole.astype(f64)
    a = (acc * ops.pow(2.0, ops.maximum(e, 0.0))).astype(i64)
    ab = a * q.astype(i64)
    nudge = ops.select(ab >= 0, ops.full_like(ab, 1 << 30), ops.full_like(ab, 1 - (1 << 30)))
    s, two31 = ab + nudge, Tensor(2**31, i64)
    high = ops.select(s >= 0, ops.floor_div(s, two31), -ops.floor_div(-s, two31))  # C division: toward zero
    p = ops.pow(2.0, ops.maximum(-e, 0.0)).astype(i64)
    floor = ops.floor_div(high, p)
    threshold = ops.floor_div(p - 1, Tensor(2, i64)) + (high < 0).astype(i64)
    return (floor + (high - floor * p > threshold).astype(i64)).astype(f64)


def lite_tanh(x: np.ndarray) -> np.ndarray:
    """Lite 2.0.0's float32 Tanh on x86_64 CPUs (measured bit-exact over [-12, 12]): a Padé (7, 6) approximant in
    fused multiply-adds, clamped to [-1, 1], so it reaches ±1 exactly where NumPy's stops at 0.99999994. A saturated
    layer's calibrated range is then exactly [-1, 1], as the converter finds it."""
    x = np.asarray(x, np.float32)
    s = (x * x).astype(np.float32)

    def fma(a: Any, b: np.ndarray, c: float) -> np.ndarray:  # one rounding, as the fused instruction
        return (np.asarray(a, np.float64) * b.astype(np.float64) + c).astype(np.float32)

    num = (fma(fma(s + np.float32(378), s, 17325.0), s, 135135.0) * x).astype(np.float32)
    den = fma(fma(fma(28.0, s, 3150.0), s, 62370.0), s, 135135.0)
    return np.clip(num / den, np.float32(-1), np.float32(1)).astype(np.float32)


def lite_tanh_graph(x: Tensor) -> Tensor:
    """``lite_tanh`` in MindSpore ops, for the int8 forward: a hidden layer's Tanh takes at most 256 distinct inputs
    (dequantized codes), so where MindSpore's own tanh and Lite's land on two sides of an output code, every row with
    that input differs; computed as Lite does, they never do. Each fused multiply-add is one rounding of an exact
    float64 product and sum."""
    f32, f64 = ms.float32, ms.float64
    s = x * x

    def fma(a: Tensor, b: Tensor, c: float) -> Tensor:
        return (a.astype(f64) * b.astype(f64) + c).astype(f32)

    num = fma(fma(s + 378.0, s, 17325.0), s, 135135.0) * x
    den = fma(fma(fma(ops.full_like(s, 28.0), s, 3150.0), s, 62370.0), s, 135135.0)
    return ops.clamp(num / den, -1.0, 1.0)


def lite_linear(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Lite 2.0.0's float32 MatMul with bias on x86_64 (what its calibration runs, measured bit-exact): the sum starts
    at the bias and adds ``x[:, k] * w[:, k]`` in order of ``k``, one fused multiply-add each."""
    acc = np.broadcast_to(b.astype(np.float32), (len(x), len(w))).astype(np.float32)
    w64 = w.astype(np.float64)
    for k in range(w.shape[1]):
        acc = (acc + x[:, k : k + 1].astype(np.float64) * w64[:, k]).astype(np.float32)
    return acc


def activation_ranges(weights: Sequence[tuple[np.ndarray, np.ndarray]], x: np.ndarray, tanh: bool,
                      kept: Sequence[int] = ()) -> np.ndarray:  # fmt: skip
    """[min, max] of every tensor of the trunk's float forward on the rows ``x`` (its input), with the int8 grid's
    weights: what Lite's MAX_MIN calibration observes when it runs the exported float graph on the same rows (its
    MatMul's order of sums and its Tanh, so the scales come out bit for bit). ``kept``: the Dense layers (by order)
    kept in fp32, whose weights stay as they are."""
    ranges = [(x.min(), x.max())]
    h = x.astype(np.float32)
    for k, (w, b) in enumerate(weights):
        h = lite_linear(h, w if k in kept else snap_weights(w), b)
        ranges.append((h.min(), h.max()))
        if k < len(weights) - 1:
            h = lite_tanh(h) if tanh else np.maximum(h, 0.0)
            ranges.append((h.min(), h.max()))
    return np.asarray(ranges, np.float32)
