"""Localise the first stage at which a runtime departs from the training path.

Runtimes expose only graph outputs, so each stage is tested as a hypothesis against the reference
Cell's pieces: preprocessing (does the runtime match the policy *without* normalisation?),
network (actor and critic outputs), post-processing (same logits/mean, different action), sampling
(deterministic graph agrees, stochastic graph does not under the same noise), precision (small,
uniform relative error of a half-precision export) and provenance (another checkpoint).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Diagnosis:
    stage: str  # provenance | preprocessing | network | postprocessing | sampling | precision | version | unknown
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"stage": self.stage, "detail": self.detail}


def _close(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    mask = np.isfinite(a) & np.isfinite(b)
    return bool(a.shape == b.shape and np.allclose(a[mask], b[mask], atol=atol, rtol=rtol))


def diagnose(
    *,
    det_param_ok: bool,
    det_action_ok: bool,
    sample_ok: bool,
    value_ok: bool,
    got_param: np.ndarray,
    param_without_norm: np.ndarray | None,
    got_action: np.ndarray,
    unscaled_action: np.ndarray | None,
    max_rel_param: float,
    cosine_param: float,
    bundle_precision: str,
    checkpoint_matches: bool | None,
    atol: float = 1e-4,
    rtol: float = 1e-4,
) -> Diagnosis:
    """Rules ordered from the most specific explanation to the most general; ``atol``/``rtol`` (the preset's)
    decide when the runtime's outputs "equal" a hypothesis (a half-precision graph is only that close)."""
    if checkpoint_matches is False:
        return Diagnosis("provenance", "the bundle was exported from a different checkpoint (sha256 differs)")
    if det_param_ok and det_action_ok and not sample_ok:
        return Diagnosis(
            "sampling",
            "deterministic outputs agree but sampled actions differ under identical noise: the noise "
            "stream or its transformation differs",
        )
    if det_param_ok and not det_action_ok:
        if unscaled_action is not None and _close(got_action, unscaled_action, atol, rtol):
            return Diagnosis("postprocessing", "actions equal the raw mean: scaling to the action bounds is missing")
        return Diagnosis("postprocessing", "same logits/mean but different actions: action post-processing differs")
    if not det_param_ok:
        if param_without_norm is not None and _close(got_param, param_without_norm, atol, rtol):
            return Diagnosis(
                "preprocessing",
                "outputs match the policy without observation normalisation: the graph does not normalise observations",
            )
        if bundle_precision == "fp16":
            return Diagnosis(
                "precision",
                f"an fp16 export: max relative difference {max_rel_param:.1e}, cosine "
                f"{cosine_param:.6f}; use the fp16 tolerance preset or export fp32",
            )
        stage = "network (actor)" if value_ok else "network (actor and critic)"
        return Diagnosis("network", f"{stage} outputs differ with preprocessing ruled out: weights differ")
    return Diagnosis("unknown", "no single stage explains the difference")
