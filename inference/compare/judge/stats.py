"""Element-wise comparison statistics (Polygraphy/msprobe conventions).

An element fails only when ``abs > atol`` **and** ``rel > rtol``; NaN matches NaN at the same position
and nothing else. Integer outputs (discrete actions) compare exactly. A tolerance whose atol grows with the
output's magnitude (``Tolerance.scale``) takes that magnitude per row: ordinary rows share the largest magnitude
among ordinary rows, and an edge-case row (±1e4 observations) is judged against its own, so synthetic extremes
never loosen the tolerance of the rows a policy really sees.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass
class Tolerance:
    atol: float
    rtol: float
    scale: float = 0.0  # adds ``scale * max|ref row|`` to atol: for errors that grow with the output's magnitude

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    def describe(self) -> str:
        grows = f" + {self.scale:g} x row max|ref|" if self.scale else ""
        return f"atol {self.atol:g}{grows}, rtol {self.rtol:g}"

    def row_atol(self, ref: np.ndarray, pooled: np.ndarray | None = None) -> np.ndarray:
        """The absolute tolerance of each row of ``ref`` (batch first; a scalar-per-row output is its own row).

        ``pooled`` marks the ordinary rows: they share the largest magnitude among them. Every other row is judged
        against its own magnitude (never less than the ordinary rows'). ``None``: every row is ordinary.
        """
        ref = np.asarray(ref, np.float64)
        rows = ref.reshape(len(ref), -1) if ref.ndim else ref.reshape(1, 1)
        if not self.scale:
            return np.full(len(rows), self.atol)
        finite = np.where(np.isfinite(rows), np.abs(rows), 0.0)
        own = finite.max(1) if finite.shape[1] else np.zeros(len(rows))
        pooled = np.ones(len(rows), bool) if pooled is None or len(pooled) != len(rows) else np.asarray(pooled, bool)
        shared = float(own[pooled].max()) if pooled.any() else 0.0
        magnitude = np.where(pooled, shared, np.maximum(own, shared))
        return self.atol + self.scale * magnitude

    def allowance(self, values: np.ndarray, row_atol: np.ndarray | float) -> np.ndarray:
        """How far each element may move and still pass: ``max(atol of its row, rtol * |value|)`` (an element fails
        only when it is off by more than both)."""
        return np.maximum(row_atol, self.rtol * np.abs(np.asarray(values, np.float64)))


@dataclass(frozen=True)
class Preset:
    """What a tolerance preset promises, element by element and for the policy as a whole.

    * ``tolerance``: every float output within ``atol`` or ``rtol`` (Polygraphy's rule), per element.
    * Discrete actions: an action may differ from the reference's only where the reference's margin between its
      choice and the runtime's is within what the tolerance granted to the scores lets those two scores move (the
      sum of their ``Tolerance.allowance``), and in at most ``max_flip_rate`` of the observations (and of the
      teacher-forced steps). The same rule under every preset and for every runtime.
    * Free-running episodes: ``"exact"`` compares them step by step (only chaotic amplification of differences
      below tolerance is forgiven); ``"returns"`` compares the distribution of episode returns: the mean return may
      move by at most ``return_tolerance * max(|reference mean|, reference std, 1)`` and a two-sample
      Kolmogorov-Smirnov test may not reject equality at ``ks_alpha``; a larger move within the noise of the paired
      episodes (3 standard errors of their differences) is not judged (an error naming the episodes that would judge
      it), and a move beyond 4x the bound fails whatever the noise (``episode_checks.returns_check``).
    """

    name: str
    tolerance: Tolerance
    max_flip_rate: float = 0.0
    free_running: str = "exact"
    return_tolerance: float = 0.0
    ks_alpha: float = 0.01
    # "visited": only the observations the policy really saw (visited in episodes, recorded) are judged, element-wise
    # and in policy terms: a precision plan is accountable for those (int8 kernels saturate outside the range they
    # were calibrated on, by design); the synthetic rows are still compared and reported. "all": every finite row.
    judge_rows: str = "all"
    # True: the policy-level bounds (``policy_bounds``) decide the verdict, as they do for int8, whose element-wise
    # numbers say little; False: the element-wise tolerance decides and a policy beyond its bounds is a warning.
    policy_decides: bool = False

    def judged(self, feeds: Any) -> np.ndarray:
        """The feed rows this preset judges (``judge_rows``); all finite rows when none was visited."""
        if self.judge_rows != "visited":
            return feeds.finite
        visited = feeds.finite & np.isin(feeds.source, ("episode", "recorded"))
        return visited if visited.any() else feeds.finite & feeds.ordinary

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# fp32 sits well above the ~1e-6 seen between MindSpore and Lite (and the ~3e-5 of ONNX Runtime on large logits):
# any other difference is a fault. fp16 allows what half precision does: ~1e-3 relative drift (1.5e-3 on the
# logits of a trained CartPole policy), so 1e-3 plus 1% of the output's largest magnitude, elements off by more
# than 1%; rare action flips at near-ties (1-3 in 10k measured); and episodes that part ways at a flip while the
# task is solved as well (returns compared as distributions). int8 (Lite's quantized kernels, a precision plan's
# lowered layers) moves every output by up to a few percent of its magnitude by design: its policy-level bounds decide
# (``policy_bounds.POLICY_BOUNDS``), on the observations the policy really saw, with at most 1% flips and 5% of the
# return; the element-wise tolerance (10% of the output's largest magnitude) only catches what no quantization does.
PRESETS: dict[str, Preset] = {
    "fp32": Preset("fp32", Tolerance(1e-4, 1e-4), max_flip_rate=1e-3),
    "fp16": Preset("fp16", Tolerance(1e-3, 1e-2, scale=1e-2), max_flip_rate=5e-3, free_running="returns",
                   return_tolerance=0.05),
    "int8": Preset("int8", Tolerance(1e-3, 1e-2, scale=0.1), max_flip_rate=1e-2, free_running="returns",
                   return_tolerance=0.05, judge_rows="visited", policy_decides=True),
}  # fmt: skip
TOLERANCE_PRESETS: dict[str, Tolerance] = {name: preset.tolerance for name, preset in PRESETS.items()}
# ONNX Runtime differs from MindSpore's CPU kernels in two ways that grow with magnitude: its MLAS GEMM sums in
# another order, and its Tanh is exact where MindSpore's CPU Tanh is an approximation (|error| up to 1.0e-4 near
# |x| = 5, ``compat`` notes), so a squash to bounds ±b moves actions by up to 1e-4 x b. Measured on the trainer's
# presets (8,192 steps and fully trained runs, 5 seeds each) and a CNN: at most 1.1e-4 x the largest magnitude
# among the ordinary rows (2.2e-4 on a Pendulum action saturated at 2), and on the ±1e4 edge rows at most 1e-5 x
# their own magnitude (bench/ort_tolerance.py, bench/results/ort_tolerance.md). Its fp32 atol is therefore 1e-5
# plus 2e-4 x the row's magnitude: 1.8x the measured need, and tight enough to see a weight moved by 1e-2.
# MindSpore's own graph paths run the training kernels: bitwise equal on MLPs, a few ULP of the row's magnitude
# where graph mode fuses differently (1.2e-6 on GRU logits of magnitude ~8), so they are held to 1e-6 plus 1e-6 x
# the row's magnitude: tight enough to see a single weight moved by 1e-3 (~1e-5 on the Gaussian mean).
RUNTIME_OVERRIDES: dict[str, dict[str, Tolerance]] = {
    "onnxruntime": {"fp32": Tolerance(1e-5, 1e-4, scale=2e-4)},
    "ms-graph": {"fp32": Tolerance(1e-6, 1e-6, scale=1e-6)},
    "ms-mindir": {"fp32": Tolerance(1e-6, 1e-6, scale=1e-6)},
    # Lite's float16 CPU kernels compute an fp32 bundle in half precision: held to what half precision promises
    "lite-aarch64-fp16": {"fp32": PRESETS["fp16"].tolerance},
}


def score_allowance(
    tol: Tolerance, v_i: np.ndarray, v_j: np.ndarray, row_atol: np.ndarray | float, probabilities: bool = False
) -> np.ndarray:
    """How far the margin between two decision scores may close when the judged output's entries ``v_i`` (the
    reference's choice) and ``v_j`` (the runtime's) each move within their ``Tolerance.allowance``.

    Scores are the output itself (logits, Q-values), or with ``probabilities`` its log (a probs output): then
    ``p_i`` may fall and ``p_j`` rise by their allowances, which closes ``log p_i - log p_j`` by the log ratios.
    """
    a_i, a_j = tol.allowance(v_i, row_atol), tol.allowance(v_j, row_atol)
    if not probabilities:
        return a_i + a_j
    p_i, p_j = np.abs(np.asarray(v_i, np.float64)), np.abs(np.asarray(v_j, np.float64))
    tiny = np.finfo(np.float64).tiny
    with np.errstate(divide="ignore"):
        return np.log(p_i) - np.log(np.maximum(p_i - a_i, tiny)) + np.log(p_j + a_j) - np.log(np.maximum(p_j, tiny))


def flip_bound(
    top2: np.ndarray, tol: Tolerance, row_atol: np.ndarray | None = None, probabilities: bool = False
) -> np.ndarray:
    """The largest margin between two scores that ``tol`` lets them close (``score_allowance``).

    ``top2`` rows are ``[margin, |v1|, |v2|, max |v|]`` (``contract.top2_margin``; golden files of version 2 hold
    ``[margin, scale]``); ``row_atol`` is each row's absolute tolerance (default: from its own magnitude).
    """
    top2 = np.asarray(top2, np.float64)
    if top2.shape[-1] == 2:  # [margin, scale]
        top2 = np.concatenate([top2, top2[..., 1:], top2[..., 1:]], -1)
    if row_atol is None:
        row_atol = tol.atol + tol.scale * top2[..., 3]
    return score_allowance(tol, top2[..., 1], top2[..., 2], row_atol, probabilities)


def tolerance_for(preset: str, runtime: str) -> Tolerance:
    return RUNTIME_OVERRIDES.get(runtime, {}).get(preset, TOLERANCE_PRESETS[preset])


def ks_two_sample(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Two-sample Kolmogorov-Smirnov statistic and its p-value from the asymptotic Kolmogorov distribution with
    Stephens' small-sample correction (NumPy only). Identical samples give (0, 1)."""
    a, b = np.sort(np.asarray(a, np.float64)), np.sort(np.asarray(b, np.float64))
    if not len(a) or not len(b):
        return 0.0, 1.0
    grid = np.concatenate([a, b])
    d = float(np.abs(np.searchsorted(a, grid, "right") / len(a) - np.searchsorted(b, grid, "right") / len(b)).max())
    if d == 0.0:
        return 0.0, 1.0
    n = len(a) * len(b) / (len(a) + len(b))
    lam = (np.sqrt(n) + 0.12 + 0.11 / np.sqrt(n)) * d
    k = np.arange(1, 101)
    p = float(np.clip(2.0 * np.sum((-1.0) ** (k - 1) * np.exp(-2.0 * (k * lam) ** 2)), 0.0, 1.0))
    return d, p


def _ordered(x: np.ndarray) -> np.ndarray:
    """Map float32 bit patterns to integers whose difference is the ULP distance."""
    i = x.astype(np.float32).view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> int:
    """The largest float32 ULP distance between two same-shaped arrays, over the elements finite in both."""
    a, b = np.asarray(a, np.float32).ravel(), np.asarray(b, np.float32).ravel()
    both = np.isfinite(a) & np.isfinite(b)
    return int(np.abs(_ordered(a[both]) - _ordered(b[both])).max(initial=0))


@dataclass
class ArrayComparison:
    """How far ``got`` is from ``ref`` for one output."""

    name: str
    passed: bool
    count: int
    exact: bool  # integer comparison
    mismatches: int
    first_mismatch: int | None  # flat index of the first failing element
    max_abs: float = 0.0
    mean_abs: float = 0.0
    p99_abs: float = 0.0
    max_rel: float = 0.0
    mean_rel: float = 0.0
    p99_rel: float = 0.0
    cosine: float = 1.0
    max_ulp: int = 0
    required_atol: float = 0.0  # the smallest atol that passes with rtol = 0
    required_rtol: float = 0.0  # the smallest rtol that passes with atol = 0
    within_1e3: float = 1.0
    within_1e2: float = 1.0
    nan_mismatches: int = 0
    atol: float | None = None  # the effective absolute tolerance: the largest row's, and the median row's
    atol_median: float | None = None
    rtol: float | None = None
    tolerance: str | None = None  # the rule, e.g. "atol 0.002 + 0.0001 x row max|ref|, rtol 0.0001"
    shape_mismatch: str | None = None  # "[1, 1] vs expected [256, 1]": nothing else was compared

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """One phrase for a failure: a shape mismatch is said as such, never as an infinite difference."""
        if self.shape_mismatch:
            return f"{self.name} has shape {self.shape_mismatch}"
        if self.exact:
            return f"{self.name} {self.mismatches}/{self.count} integers differ (max |diff| {self.max_abs:g})"
        parts = []
        if self.mismatches > self.nan_mismatches:
            parts.append(f"max abs {self.max_abs:.2e}")
        if self.nan_mismatches:
            parts.append(f"{self.nan_mismatches} NaN where the other side has a number")
        return f"{self.name} {self.mismatches}/{self.count} ({'; '.join(parts)})"


def compare_arrays(
    name: str, ref: np.ndarray, got: np.ndarray, tol: Tolerance, pooled: np.ndarray | None = None
) -> ArrayComparison:
    """``ref`` vs ``got`` under ``tol``; ``pooled`` marks the ordinary rows (``Tolerance.row_atol``)."""
    ref, got = np.asarray(ref), np.asarray(got)
    if ref.shape != got.shape:
        mismatch = f"{list(got.shape)} vs expected {list(ref.shape)}"
        return ArrayComparison(name, False, int(ref.size), False, int(ref.size), None, shape_mismatch=mismatch,
                               tolerance=tol.describe())  # fmt: skip
    if np.issubdtype(ref.dtype, np.integer) or np.issubdtype(got.dtype, np.integer):
        gap = np.abs(ref.astype(np.float64) - got.astype(np.float64)).ravel()  # NaN in a float side never matches
        diff = ~(gap == 0)
        first = int(np.argmax(diff)) if diff.any() else None
        largest = float(np.nan_to_num(gap, nan=np.inf).max(initial=0.0))
        return ArrayComparison(name, not diff.any(), int(ref.size), True, int(diff.sum()), first, max_abs=largest,
                               required_atol=largest)  # fmt: skip

    r, g = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
    nan_r, nan_g = np.isnan(r), np.isnan(g)
    nan_mismatch = nan_r != nan_g
    both = ~(nan_r | nan_g)
    abs_d = np.where(both, np.abs(r - g), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel_d = np.where(both, abs_d / np.abs(r), 0.0)
    rel_d = np.where(both & (abs_d == 0), 0.0, rel_d)
    rel_d = np.nan_to_num(rel_d, nan=0.0, posinf=np.inf)
    row_atol = tol.row_atol(ref, pooled)
    atol = np.repeat(row_atol, r.size // max(1, len(row_atol))) if len(row_atol) else np.zeros(0)
    fail = ((abs_d > atol) & (rel_d > tol.rtol)) | nan_mismatch
    rv, gv = r[both], g[both]
    denom = np.linalg.norm(rv) * np.linalg.norm(gv)
    cosine = float(np.dot(rv, gv) / denom) if denom > 0 else (1.0 if np.array_equal(rv, gv) else 0.0)
    ulp = np.abs(_ordered(ref.ravel()[both]) - _ordered(got.ravel()[both])) if both.any() else np.zeros(1, np.int64)
    valid_abs, valid_rel = abs_d[both], rel_d[both]
    if not len(valid_abs):
        valid_abs = valid_rel = np.zeros(1)
    return ArrayComparison(
        name=name,
        passed=not fail.any(),
        count=int(r.size),
        exact=False,
        mismatches=int(fail.sum()),
        first_mismatch=int(np.argmax(fail)) if fail.any() else None,
        max_abs=float(valid_abs.max()),
        mean_abs=float(valid_abs.mean()),
        p99_abs=float(np.percentile(valid_abs, 99)),
        max_rel=float(valid_rel.max()),
        mean_rel=float(valid_rel.mean()),
        p99_rel=float(np.percentile(valid_rel, 99)),
        cosine=cosine,
        max_ulp=int(ulp.max()),
        required_atol=float(valid_abs.max()),
        required_rtol=float(valid_rel.max()),
        within_1e3=float((valid_abs <= 1e-3).mean()),
        within_1e2=float((valid_abs <= 1e-2).mean()),
        nan_mismatches=int(nan_mismatch.sum()),
        atol=float(row_atol.max()) if len(row_atol) else tol.atol,
        atol_median=float(np.median(row_atol)) if len(row_atol) else tol.atol,
        rtol=tol.rtol,
        tolerance=tol.describe(),
    )
