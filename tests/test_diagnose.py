"""The diagnosis rules on hand-made evidence: each stage is named only when its evidence says so."""

from __future__ import annotations

import pytest

from inference.compare.judge.diagnose import Evidence, diagnose


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


def test_a_mismatch_never_reads_max_abs_0():
    """Integer actions that differ and outputs that are NaN where the reference has numbers: said as such."""
    import numpy as np

    from inference.compare.judge.stats import Tolerance, compare_arrays

    tol = Tolerance(1e-4, 1e-4)
    ints = compare_arrays("action", np.array([0, 1, 2, 1]), np.array([0, 2, 2, 3]), tol)
    assert not ints.passed and ints.describe() == "action 2/4 integers differ (max |diff| 2)"
    nan = compare_arrays("logits", np.ones((3, 2), np.float32), np.full((3, 2), np.nan, np.float32), tol)
    assert not nan.passed and nan.describe() == "logits 6/6 (6 NaN where the other side has a number)"
    mixed = compare_arrays("q", np.array([1.0, 2.0, 3.0]), np.array([1.0, np.nan, 3.5]), tol)
    assert mixed.describe() == "q 2/3 (max abs 5.00e-01; 1 NaN where the other side has a number)"
    for cmp in (ints, nan, mixed):
        assert "(max abs 0" not in cmp.describe()


def test_the_next_state_takes_its_batch_from_the_states_own_output():
    """A state-independent ``log_std`` listed first ([1, A]) says nothing of the batch."""
    import numpy as np

    from inference.bundle.contract import ContractError, PolicyContract

    contract = PolicyContract.from_dict({
        "input": {"obs": [4]}, "state": {"h": {"shape": [8], "next": "h_next", "init": "zeros"}},
        "outputs": {"names": ["log_std", "mean", "h_next"]},
        "action": {"kind": "gaussian", "mean": "mean", "log_std": "log_std"},
    })  # fmt: skip
    h = np.arange(5 * 8, dtype=np.float32).reshape(5, 8)
    state = contract.next_state({"log_std": np.zeros((1, 2), np.float32), "mean": np.zeros((5, 2)), "h_next": h})
    assert state.shape == (5,) and np.array_equal(state["h"], h)
    one = contract.next_state({"log_std": np.zeros((1, 8), np.float32), "mean": np.zeros((1, 2)), "h_next": h[:1]})
    assert one.shape == (1,) and np.array_equal(one["h"], h[:1])
    with pytest.raises(ContractError, match="'h_next' has shape \\[5, 7\\]"):
        contract.next_state({"log_std": np.zeros((1, 2)), "mean": np.zeros((5, 2)), "h_next": h[:, :7]})


@pytest.mark.parametrize(
    ("ops", "cell_couples", "stage", "says"),
    [
        ([], None, "batch-coupled", "has no BatchNorm or Dropout"),
        ([], True, "batch-coupled", "in the Cell as in"),
        (["BatchNorm"], True, "batch-coupled", "BatchNorm in the graph is not the cause"),
        (["BatchNorm"], False, "training-mode", "set_train(False)"),
    ],
)
def test_a_row_that_depends_on_its_batch_is_training_mode_only_with_batchnorm_or_dropout(ops, cell_couples, stage,
                                                                                          says):  # fmt: skip
    from inference.compare.judge.diagnose import not_repeatable

    found = not_repeatable(ops, True, "the graph", cell_couples)
    assert found.stage == stage and says in found.detail, found
    assert "BatchNorm batch statistics would do this" not in found.detail


def test_the_network_rule_never_says_preprocessing_is_ruled_out():
    for matches in (True, None):
        e = evidence(param_ok=False)
        e.checkpoint_matches = matches
        found = diagnose(e)
        assert found.stage == "network" and "ruled out" not in found.detail, found


def test_outputs_with_no_role_that_differ_are_the_network_s():
    """XuanCe's DQN returns its features, its integer greedy action and its Q-values: a nudged weight moves the
    Q-values without flipping an action; that is a network difference, not "no single stage"."""
    assert diagnose(evidence()).stage == "unknown"
    found = diagnose(Evidence(**{**evidence().__dict__, "others_failed": ("q", "state")}))
    assert found.stage == "network" and "the outputs q, state do not" in found.detail, found
