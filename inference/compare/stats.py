"""Element-wise comparison statistics (Polygraphy/msprobe conventions).

An element fails only when ``abs > atol`` **and** ``rel > rtol``; NaN matches NaN at the same position
and nothing else. Integer outputs (discrete actions) compare exactly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass
class Tolerance:
    atol: float
    rtol: float
    scale: float = 0.0  # adds ``scale * max|ref|`` to atol: for errors that grow with the output's magnitude

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class Preset:
    """What a tolerance preset promises, element by element and for the policy as a whole.

    * ``tolerance``: every float output within ``atol`` or ``rtol`` (Polygraphy's rule), per element.
    * Discrete actions: with ``allow_flips`` an action may differ from the reference's only where the reference's
      top-2 score margin is within what the tolerance lets two scores move, ``2 * (atol + rtol * |score|)``, and in
      at most ``max_flip_rate`` of the observations (and of the teacher-forced steps). Without it they are exact.
    * Free-running episodes: ``"exact"`` compares them step by step (only chaotic amplification of differences
      below tolerance is forgiven); ``"returns"`` compares the distribution of episode returns: the mean return may
      move by at most ``return_tolerance * max(|reference mean|, reference std, 1)`` and a two-sample
      Kolmogorov-Smirnov test may not reject equality at ``ks_alpha``.
    """

    name: str
    tolerance: Tolerance
    allow_flips: bool = False
    max_flip_rate: float = 0.0
    free_running: str = "exact"
    return_tolerance: float = 0.0
    ks_alpha: float = 0.01

    def flip_bound(self, scale: np.ndarray, tol: Tolerance | None = None) -> np.ndarray:
        """Per row, the largest top-2 margin two scores of magnitude ``scale`` can close within the tolerance."""
        tol = tol or self.tolerance
        return 2.0 * (tol.atol + tol.rtol * np.asarray(scale, np.float64))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# fp32 sits well above the ~1e-6 seen between MindSpore and Lite (and the ~3e-5 of ONNX Runtime on large logits):
# any other difference is a fault. fp16 allows what half precision does: ~1e-3 relative drift (1.5e-3 on the
# logits of a trained CartPole policy), so 1e-3 plus 1% of the output's largest magnitude, elements off by more
# than 1%; rare action flips at near-ties (1-3 in 10k measured); and episodes that part ways at a flip while the
# task is solved as well (returns compared as distributions).
PRESETS: dict[str, Preset] = {
    "fp32": Preset("fp32", Tolerance(1e-4, 1e-4)),
    "fp16": Preset("fp16", Tolerance(1e-3, 1e-2, scale=1e-2), allow_flips=True, max_flip_rate=5e-3,
                   free_running="returns", return_tolerance=0.05),
}  # fmt: skip
TOLERANCE_PRESETS: dict[str, Tolerance] = {name: preset.tolerance for name, preset in PRESETS.items()}
# ONNX Runtime's MLAS GEMM sums in another order, so its error grows with the output's magnitude: measured
# max |diff| / max |output| <= 5e-5 (1.2e-3 on values of ~40, 4.9e-3 on values of ~100, also where such terms
# cancel to near zero). Its fp32 atol is therefore 2e-3 plus 1e-4 x the output's largest magnitude.
# MindSpore's own graph paths run the training kernels: measured bitwise equal, so they are held to 1e-6,
# tight enough to see a single weight moved by 1e-3 (~1e-5 on the Gaussian mean).
RUNTIME_OVERRIDES: dict[str, dict[str, Tolerance]] = {
    "onnxruntime": {"fp32": Tolerance(2e-3, 1e-4, scale=1e-4)},
    "ms-graph": {"fp32": Tolerance(1e-6, 1e-6)},
    "ms-mindir": {"fp32": Tolerance(1e-6, 1e-6)},
}


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
    atol: float | None = None
    rtol: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def compare_arrays(name: str, ref: np.ndarray, got: np.ndarray, tol: Tolerance) -> ArrayComparison:
    ref, got = np.asarray(ref), np.asarray(got)
    if ref.shape != got.shape:
        return ArrayComparison(name, False, int(ref.size), False, int(ref.size), 0, max_abs=float("inf"))
    if np.issubdtype(ref.dtype, np.integer) or np.issubdtype(got.dtype, np.integer):
        diff = (ref.astype(np.int64) != got.astype(np.int64)).ravel()
        first = int(np.argmax(diff)) if diff.any() else None
        return ArrayComparison(name, not diff.any(), int(ref.size), True, int(diff.sum()), first)

    r, g = ref.astype(np.float64).ravel(), got.astype(np.float64).ravel()
    nan_r, nan_g = np.isnan(r), np.isnan(g)
    nan_mismatch = nan_r != nan_g
    both = ~(nan_r | nan_g)
    abs_d = np.where(both, np.abs(r - g), 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel_d = np.where(both, abs_d / np.abs(r), 0.0)
    rel_d = np.where(both & (abs_d == 0), 0.0, rel_d)
    rel_d = np.nan_to_num(rel_d, nan=0.0, posinf=np.inf)
    finite_ref = np.abs(r[both])
    atol = tol.atol + tol.scale * (float(finite_ref.max()) if finite_ref.size else 0.0)
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
        atol=atol,
        rtol=tol.rtol,
    )
