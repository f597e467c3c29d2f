import numpy as np
from mindspore import Tensor

from msrl_consistency.agent.preprocess import ActionPostprocess, ObsNormalizer, RunningMeanStd, numpy_normalize


def test_in_graph_normalisation_matches_numpy_reference():
    rng = np.random.default_rng(0)
    mean = rng.standard_normal(6).astype(np.float32)
    var = rng.uniform(0.01, 4.0, 6).astype(np.float32)
    obs = (rng.standard_normal((500, 6)) * 20).astype(np.float32)  # some values get clipped
    norm = ObsNormalizer(6, clip=5.0)
    norm.mean.set_data(Tensor(mean))
    norm.var.set_data(Tensor(var))
    out = norm(Tensor(obs)).asnumpy()
    ref = numpy_normalize(obs, mean, var, 5.0)
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=1e-6)
    assert np.abs(out).max() == 5.0 and (np.abs(out) == 5.0).sum() > 10
    assert not norm.mean.requires_grad and not norm.var.requires_grad


def test_disabled_normaliser_is_identity():
    obs = np.arange(12, dtype=np.float32).reshape(3, 4) * 100
    np.testing.assert_array_equal(ObsNormalizer(4, 10.0, enabled=False)(Tensor(obs)).asnumpy(), obs)


def test_running_statistics_match_parallel_variance_reference():
    rng = np.random.default_rng(1)
    batches = [rng.normal(3.0, 2.0, (int(rng.integers(1, 300)), 3)) for _ in range(20)]
    rms = RunningMeanStd.zeros(3)
    for b in batches:
        rms.update(b)
    everything = np.concatenate(batches)
    # The prior (mean 0, var 1, count 1e-4) shifts the result by O(1e-4 / N), far below this tolerance.
    np.testing.assert_allclose(rms.mean, everything.mean(0), rtol=1e-5)
    np.testing.assert_allclose(rms.var, everything.var(0), rtol=1e-5)
    assert rms.count == np.float64(1e-4) + len(everything)


def test_action_postprocess_clip_and_tanh_rescale_to_bounds():
    low, high = [-2.0, 0.0], [2.0, 1.0]
    raw = np.array([[-3.0, 0.0], [0.5, 2.0], [0.0, -0.5]], np.float32)
    clip = ActionPostprocess(low, high, "clip")(Tensor(raw)).asnumpy()
    np.testing.assert_allclose(clip, [[-2.0, 0.5], [1.0, 1.0], [0.0, 0.25]], rtol=1e-6)
    squash = ActionPostprocess(low, high, "tanh")(Tensor(raw)).asnumpy()
    np.testing.assert_allclose(squash, [0, 0.5] + np.tanh(raw) * [2.0, 0.5], rtol=1e-5, atol=1e-6)
