"""The diagnosis rules on hand-made evidence: each stage is named only when its evidence says so."""

from __future__ import annotations

import pytest

from inference.compare.diagnose import Evidence, diagnose


def evidence(precision: str = "fp32", **failed: bool) -> Evidence:
    base = {"param_ok": True, "action_ok": True, "sample_ok": True, "value_ok": True}
    return Evidence(**{**base, **failed}, max_rel_param=3e-3, cosine_param=0.99999, precision=precision,
                    checkpoint_matches=True)  # fmt: skip


@pytest.mark.parametrize(
    ("failed", "fp32_stage", "fp16_detail"),
    [
        ({"param_ok": False}, "network", "max relative difference 3.0e-03"),
        ({"action_ok": False}, "postprocessing", "the actions differ where the outputs' fp16 error moves them"),
        ({"sample_ok": False}, "sampling", "sampled actions differ where fp16 error moves a sample"),
    ],
)
def test_an_fp16_difference_is_diagnosed_as_precision_at_every_stage(failed, fp32_stage, fp16_detail):
    """Scores, deterministic actions and samples: in an fp16 export each is precision; the same evidence in an fp32
    export names the stage that would then be at fault."""
    half = diagnose(evidence("fp16", **failed))
    assert half.stage == "precision" and fp16_detail in half.detail, half
    assert diagnose(evidence("fp32", **failed)).stage == fp32_stage


def test_structural_evidence_outranks_precision():
    """A missing squash or normalisation is named as such even in an fp16 export."""
    assert diagnose(evidence("fp16", param_ok=False, without_norm_matches=True)).stage == "preprocessing"
    assert diagnose(evidence("fp16", action_ok=False, raw_mean_action=True)).stage == "postprocessing"
    assert diagnose(evidence("fp16", sample_ok=False, unsquashed_sample=True)).stage == "postprocessing"
    other_checkpoint = evidence("fp16", param_ok=False)
    other_checkpoint.checkpoint_matches = False
    assert diagnose(other_checkpoint).stage == "provenance"
