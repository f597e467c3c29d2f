import numpy as np
import pytest
from mindspore import Tensor
from scipy import special, stats

from msrl_consistency.agent import distributions as D


def test_categorical_log_prob_and_entropy_match_closed_form():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((64, 5)).astype(np.float32)
    actions = rng.integers(0, 5, 64)
    one_hot = np.eye(5, dtype=np.float32)[actions]
    logp = D.categorical_log_prob(Tensor(logits), Tensor(one_hot)).asnumpy()
    ent = D.categorical_entropy(Tensor(logits)).asnumpy()
    ref_logp = special.log_softmax(logits.astype(np.float64), -1)[np.arange(64), actions]
    probs = special.softmax(logits.astype(np.float64), -1)
    np.testing.assert_allclose(logp, ref_logp, atol=1e-5)
    np.testing.assert_allclose(ent, stats.entropy(probs, axis=-1), atol=1e-5)


def test_gaussian_log_prob_and_entropy_match_scipy():
    rng = np.random.default_rng(1)
    mean = rng.standard_normal((32, 3)).astype(np.float32)
    log_std = rng.uniform(-1, 0.5, (32, 3)).astype(np.float32)
    x = rng.standard_normal((32, 3)).astype(np.float32)
    logp = D.gaussian_log_prob(Tensor(mean), Tensor(log_std), Tensor(x)).asnumpy()
    ent = D.gaussian_entropy(Tensor(log_std)).asnumpy()
    std = np.exp(log_std.astype(np.float64))
    np.testing.assert_allclose(logp, stats.norm.logpdf(x, mean, std).sum(-1), atol=1e-4)
    np.testing.assert_allclose(ent, stats.norm.entropy(0, std).sum(-1), atol=1e-5)


def test_same_noise_gives_same_action_and_different_noise_differs():
    logits = Tensor(np.zeros((1000, 4), np.float32))
    rng = np.random.default_rng(2)
    u = rng.random((1000, 4), dtype=np.float32)
    a1 = D.gumbel_argmax(logits, Tensor(u)).asnumpy()
    a2 = D.gumbel_argmax(logits, Tensor(u.copy())).asnumpy()
    a3 = D.gumbel_argmax(logits, Tensor(rng.random((1000, 4), dtype=np.float32))).asnumpy()
    assert a1.dtype == np.int32
    np.testing.assert_array_equal(a1, a2)
    assert (a1 != a3).mean() > 0.5
    mean, log_std = Tensor(np.ones((5, 2), np.float32)), Tensor(np.full((5, 2), -1.0, np.float32))
    eps = rng.standard_normal((5, 2)).astype(np.float32)
    s = D.gaussian_sample(mean, log_std, Tensor(eps)).asnumpy()
    np.testing.assert_allclose(s, 1.0 + np.exp(np.float32(-1.0)) * eps, rtol=1e-5)


@pytest.mark.parametrize("logits", [[1.0, 0.0, -1.0], [2.5, 2.0, -3.0, 0.1]])
def test_gumbel_max_frequencies_match_softmax(logits):
    n = 40_000
    rng = np.random.default_rng(3)
    u = rng.random((n, len(logits)), dtype=np.float32)
    actions = D.gumbel_argmax(Tensor(np.tile(np.float32(logits), (n, 1))), Tensor(u)).asnumpy()
    freq = np.bincount(actions, minlength=len(logits)) / n
    probs = special.softmax(np.array(logits))
    # 4 standard errors of a binomial proportion.
    assert np.all(np.abs(freq - probs) < 4 * np.sqrt(probs * (1 - probs) / n) + 1e-3)


def test_uniform_noise_at_zero_or_one_stays_finite():
    u = Tensor(np.array([[0.0, 1.0, 0.5]], np.float32))
    a = D.gumbel_argmax(Tensor(np.zeros((1, 3), np.float32)), u).asnumpy()
    assert a.tolist() == [1]
