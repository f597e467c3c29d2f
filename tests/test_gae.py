import numpy as np
import pytest

from msrl_consistency.training.gae import compute_gae


def test_gae_matches_hand_computation_with_termination():
    # One env, three steps, episode terminates at t=1; a new one starts at t=2.
    gamma, lam = 0.9, 0.8
    r = np.array([[1.0], [2.0], [3.0]], np.float32)
    v = np.array([[0.5], [1.0], [2.0]], np.float32)
    d = np.array([[False], [True], [False]])
    last_v = np.array([4.0], np.float32)
    adv, ret = compute_gae(r, v, d, last_v, gamma, lam)
    d2 = 3.0 + gamma * 4.0 - 2.0  # bootstraps from last_value
    d1 = 2.0 - 1.0  # terminal: no bootstrap, and no GAE flow from t=2
    d0 = 1.0 + gamma * 1.0 - 0.5
    expected = np.array([[d0 + gamma * lam * d1], [d1], [d2]], np.float32)
    np.testing.assert_allclose(adv, expected, rtol=1e-6)
    np.testing.assert_allclose(ret, expected + v, rtol=1e-6)


def test_truncation_keeps_final_value_through_the_reward():
    # The loop adds gamma * V(final_obs) to the reward of a truncated step, then GAE treats it as done.
    gamma, lam, v_final = 0.99, 0.95, 7.0
    r_trunc = np.array([[1.0 + gamma * v_final]], np.float32)
    r_term = np.array([[1.0]], np.float32)
    v = np.array([[3.0]], np.float32)
    d = np.array([[True]])
    adv_trunc, _ = compute_gae(r_trunc, v, d, np.array([100.0], np.float32), gamma, lam)
    adv_term, _ = compute_gae(r_term, v, d, np.array([100.0], np.float32), gamma, lam)
    assert adv_trunc[0, 0] == pytest.approx(1.0 + gamma * v_final - 3.0)
    assert adv_term[0, 0] == pytest.approx(1.0 - 3.0)


def test_gae_lambda_one_gives_discounted_returns():
    rng = np.random.default_rng(0)
    r = rng.standard_normal((6, 2)).astype(np.float32)
    v = rng.standard_normal((6, 2)).astype(np.float32)
    d = np.zeros((6, 2), bool)
    last_v = np.zeros(2, np.float32)
    _, ret = compute_gae(r, v, d, last_v, 0.9, 1.0)
    expected = np.zeros_like(r)
    running = np.zeros(2)
    for t in reversed(range(6)):
        running = r[t] + 0.9 * running
        expected[t] = running
    np.testing.assert_allclose(ret, expected, rtol=1e-5, atol=1e-5)


def test_global_norm_clip_matches_torch_rule():
    from mindspore import Tensor

    from msrl_consistency.training.ppo import clip_by_global_norm

    rng = np.random.default_rng(4)
    grads = [rng.standard_normal(s).astype(np.float32) for s in [(3, 4), (4,), (2, 2)]]
    norm = np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads))
    for max_norm in (0.5 * norm, 2.0 * norm):
        clipped = [c.asnumpy() for c in clip_by_global_norm(tuple(Tensor(g) for g in grads), float(max_norm))]
        scale = min(1.0, max_norm / (norm + 1e-6))
        for c, g in zip(clipped, grads, strict=True):
            np.testing.assert_allclose(c, g * scale, rtol=1e-5)
