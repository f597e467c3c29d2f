"""Comparison statistics: Polygraphy's element rule, NaN handling, ULP distance, exact integers."""

import numpy as np

from inference.compare.judge.policy_level import argmax_flips, categorical_kl, gaussian_kl
from inference.compare.judge.stats import Tolerance, compare_arrays


def test_element_fails_only_when_both_abs_and_rel_exceed():
    ref = np.array([100.0, 1e-3, 5.0], np.float32)
    got = np.array([100.005, 1.5e-3, 5.0], np.float32)  # abs 5e-3 rel 5e-5 | abs 5e-4 rel 0.5 | equal
    cmp = compare_arrays("x", ref, got, Tolerance(atol=1e-3, rtol=1e-4))
    assert cmp.passed  # each element is within one of the two bounds
    strict = compare_arrays("x", ref, got, Tolerance(atol=1e-4, rtol=1e-5))
    assert not strict.passed and strict.mismatches == 2 and strict.first_mismatch == 0
    assert np.isclose(strict.required_atol, 5e-3, rtol=1e-2) and np.isclose(strict.required_rtol, 0.5, rtol=1e-2)


def test_nan_matches_nan_only_and_ulp_counts_representable_steps():
    ref = np.array([np.nan, 1.0, 2.0], np.float32)
    same = compare_arrays("x", ref, ref.copy(), Tolerance(0, 0))
    assert same.passed and same.max_ulp == 0
    got = np.array([0.0, np.nextafter(np.float32(1), np.float32(2)), 2.0], np.float32)
    cmp = compare_arrays("x", ref, got, Tolerance(1e-3, 1e-3))
    assert not cmp.passed and cmp.nan_mismatches == 1 and cmp.max_ulp == 1


def test_integer_outputs_compare_exactly():
    cmp = compare_arrays("a", np.array([0, 1, 2], np.int32), np.array([0, 2, 2], np.int32), Tolerance(10, 10))
    assert cmp.exact and not cmp.passed and cmp.mismatches == 1 and cmp.first_mismatch == 1


def test_policy_level_metrics():
    ref = np.array([[1.0, 0.9], [0.0, 2.0]])
    got = np.array([[0.9, 1.0], [0.0, 2.0]])
    flips = argmax_flips(ref, ref.argmax(1), got.argmax(1))
    assert flips["flips"] == 1 and flips["flip_rows"] == [0] and np.isclose(flips["flip_margins"][0], 0.1)
    assert categorical_kl(ref, ref).max() == 0 and categorical_kl(ref, got)[0] > 0
    one = np.array([[1.0]])
    assert np.isclose(gaussian_kl(np.array([[0.0]]), one, one, one)[0], 0.5)  # (Δμ)² / (2σ²) with σ = 1
    # Per-state std: same mean, std 1 vs 2 -> log 2 + 1/8 - 1/2.
    assert np.isclose(gaussian_kl(one, one, one, 2 * one)[0], np.log(2) + 1 / 8 - 0.5)


def _trace(obs, actions):
    from inference.compare.episodes import EpisodeTrace

    obs, actions = np.asarray(obs, np.float32)[:, None, None], np.asarray(actions, np.float32)[:, None, None]
    return EpisodeTrace(obs, actions, np.ones(obs.shape[:2]), np.ones(obs.shape[:2], bool))


def test_free_running_divergence_after_observation_drift_is_amplification_not_a_fault():
    from inference.compare.episodes import action_differences
    from inference.compare.episodes.checks import free_running_check
    from inference.compare.judge.stats import PRESETS

    fp32 = PRESETS["fp32"]

    ref = _trace([0, 1, 2, 3, 4, 5], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    # Tiny action differences move the observations from step 2 on; actions pass the tolerance only at step 4.
    chaotic = _trace([0, 1, 2.000001, 3.01, 4.5, 7], [1e-6, 1e-6, 1e-5, 5e-5, 1e-2, 0.3])
    diff = action_differences(ref, chaotic, discrete=False, atol=1e-4)
    assert diff["first_divergent_step"] == [4] and diff["first_observation_drift"] == [2]
    assert free_running_check("rt", "deterministic", diff, ref, chaotic, True, fp32).status == "warn"
    assert free_running_check("rt", "deterministic", diff, ref, chaotic, False, fp32).status == "fail"
    # Same observations, different action: the policy itself disagrees.
    wrong = _trace([0, 1, 2, 3, 4, 5], [0.0, 0.0, 0.0, 0.0, 0.5, 0.5])
    diff = action_differences(ref, wrong, discrete=False, atol=1e-4)
    assert free_running_check("rt", "deterministic", diff, ref, wrong, True, fp32).status == "fail"


def test_scale_term_widens_atol_with_the_outputs_magnitude():
    ref = np.array([100.0, 0.01], np.float32)
    got = np.array([100.0, 0.015], np.float32)  # abs 5e-3 where the output is near zero (rel 0.5)
    assert not compare_arrays("v", ref, got, Tolerance(2e-3, 1e-4)).passed
    cmp = compare_arrays("v", ref, got, Tolerance(2e-3, 1e-4, scale=1e-4))  # atol 2e-3 + 1e-4 * 100 = 1.2e-2
    assert cmp.passed and np.isclose(cmp.atol, 1.2e-2)
    assert not compare_arrays("v", ref * 0.01, got * 0.01 + [0, 1e-2], Tolerance(2e-3, 1e-4, scale=1e-4)).passed


def test_synthetic_extremes_do_not_loosen_the_tolerance_of_ordinary_rows():
    """A ±1e4 edge row judged with the ordinary rows used to grant every row atol 1e-4 x its magnitude (2 here):
    a fault of 0.01 on every real row passed. Each row is now judged against its own group's magnitude."""
    tol = Tolerance(1e-5, 1e-4, scale=1e-4)
    ref = np.tile([[1.0, 2.0]], (100, 1))
    ref[-1] = [1e4, 2e4]  # the edge row
    ordinary = np.r_[np.ones(99, bool), False]
    got = ref + np.r_[np.full(99, 0.01), 1.0][:, None]  # ordinary rows off by 0.01, the edge row by 1.0
    old_rule = compare_arrays("logits", ref, got, tol)  # every row pooled: the edge row's magnitude for all
    assert old_rule.passed
    cmp = compare_arrays("logits", ref, got, tol, ordinary)
    assert not cmp.passed and cmp.mismatches == 99 * 2  # every ordinary element, not the edge row's
    assert np.isclose(cmp.atol_median, 1e-5 + 1e-4 * 2.0) and np.isclose(cmp.atol, 1e-5 + 1e-4 * 2e4)
    assert cmp.tolerance == "atol 1e-05 + 0.0001 x row max|ref|, rtol 0.0001"
    assert np.allclose(tol.row_atol(ref, ordinary)[[0, -1]], [1e-5 + 2e-4, 1e-5 + 2.0])


def test_free_running_episodes_that_part_at_a_near_tie_flip_are_reported_not_failed():
    """A genuine bundle's runtime may flip a discrete action where the reference's two best scores are within the
    tolerance granted to them; the episodes then part ways. Under every preset that is reported (warn)."""
    from inference.compare.episodes import EpisodeTrace, action_differences
    from inference.compare.episodes.checks import free_running_check
    from inference.compare.judge.stats import PRESETS

    def trace(obs, actions):  # discrete actions: [T, K] indices
        obs, actions = np.asarray(obs, np.float32)[:, None, None], np.asarray(actions, np.int32)[:, None]
        return EpisodeTrace(obs, actions, np.ones(obs.shape[:2]), np.ones(obs.shape[:2], bool))

    ref = trace([0, 1, 2, 3, 4, 5], [0, 1, 0, 1, 0, 1])
    parted = trace([0, 1, 2, 7, 8, 9], [0, 1, 1, 0, 0, 0])  # differs from step 2 on: the flip, then its consequences
    diff = action_differences(ref, parted, discrete=True, atol=0.0)
    assert diff["first_divergent_step"] == [2]
    at_tie = np.zeros((6, 1), bool)
    at_tie[2, 0] = True
    check = free_running_check("rt", "stochastic", diff, ref, parted, True, PRESETS["fp32"], at_tie)
    assert check.status == "warn" and "near-tie" in check.summary
    assert free_running_check("rt", "stochastic", diff, ref, parted, True, PRESETS["fp32"], ~at_tie).status == "fail"
    assert free_running_check("rt", "stochastic", diff, ref, parted, False, PRESETS["fp32"], at_tie).status == "fail"


def test_free_running_episodes_of_several_heads_are_forgiven_only_where_every_differing_head_is_at_a_tie():
    """Two heads (``MultiDiscrete``): near-ties come per head. The episode is forgiven when each head that differs
    at the first divergent step flipped at a near-tie; a head at a tie does not excuse another that flipped."""
    from inference.compare.episodes import EpisodeTrace, action_differences
    from inference.compare.episodes.checks import free_running_check
    from inference.compare.judge.stats import PRESETS

    def trace(obs, actions):  # actions: [T, K, heads]
        obs, actions = np.asarray(obs, np.float32)[:, None, None], np.asarray(actions, np.int32)[:, None, :]
        return EpisodeTrace(obs, actions, np.ones(obs.shape[:2]), np.ones(obs.shape[:2], bool))

    ref = trace([0, 1, 2, 3], [[0, 0], [1, 2], [0, 1], [1, 1]])
    parted = trace([0, 1, 5, 6], [[0, 0], [1, 1], [0, 0], [0, 0]])  # head 1 flips at step 1
    diff = action_differences(ref, parted, discrete=True, atol=0.0)
    assert diff["first_divergent_step"] == [1]
    ties = np.zeros((4, 1, 2), bool)
    ties[1, 0, 1] = True  # the flipped head was at a near-tie
    check = free_running_check("rt", "stochastic", diff, ref, parted, True, PRESETS["fp32"], ties)
    assert check.status == "warn" and "near-tie" in check.summary
    other = np.zeros((4, 1, 2), bool)
    other[1, 0, 0] = True  # only the head that did not flip was at a tie
    assert free_running_check("rt", "stochastic", diff, ref, parted, True, PRESETS["fp32"], other).status == "fail"
