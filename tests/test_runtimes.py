"""Runtime conformance: every runtime available here agrees with the training path on one bundle."""

from __future__ import annotations

import numpy as np
import pytest

from msrl_consistency.artifacts.cells import TrainerCells
from msrl_consistency.compare.feeds import seeded_feeds
from msrl_consistency.runtimes.base import FeedError, RuntimeSource
from msrl_consistency.runtimes.lite import IncompatibleModel
from msrl_consistency.runtimes.registry import REFERENCE, RUNTIMES, availability, create

# ONNX Runtime sums GEMMs in another order (measured ~1e-4 on logits, ~1e-3 on value outputs of size ~40).
ATOL = {"onnxruntime": 2e-3}
CONFORMING = [n for n in RUNTIMES if n not in ("lite-mindir", "lite-python", REFERENCE)]


@pytest.fixture(scope="module", params=["cartpole", "pendulum"])
def bundle_and_ckpt(request):
    return request.getfixturevalue(f"{request.param}_bundle"), request.getfixturevalue(f"{request.param}_ckpt")


@pytest.mark.parametrize("name", CONFORMING)
@pytest.mark.parametrize("graph", ["policy", "policy_sample"])
def test_runtime_agrees_with_training_path(bundle_and_ckpt, name, graph):
    bundle, ckpt = bundle_and_ckpt
    source = RuntimeSource(bundle, TrainerCells(ckpt, bundle.policy_spec))
    reason = RUNTIMES[name].unavailable_reason(source)
    if reason:
        pytest.skip(f"{name} unavailable here: {reason}")
    inputs = seeded_feeds(bundle, 1000, seed=5).graph_inputs(bundle, graph)
    with create(REFERENCE, source, graph) as ref, create(name, source, graph) as rt:
        expected, got = ref.infer(*inputs), rt.infer(*inputs)
        single = [rt.infer(*[x[i : i + 1] for x in inputs]) for i in range(5)]
    for key, want in expected.items():
        assert got[key].shape == want.shape and got[key].dtype == want.dtype, key
        if np.issubdtype(want.dtype, np.integer):
            np.testing.assert_array_equal(got[key], want, err_msg=f"{name} {key}")
        else:
            np.testing.assert_allclose(got[key], want, atol=ATOL.get(name, 1e-5), rtol=0, err_msg=f"{name} {key}")
        for i, out in enumerate(single):  # single-step inference equals the batched row
            np.testing.assert_allclose(out[key][0], got[key][i], atol=1e-6, rtol=1e-6)


def test_feeds_are_checked_against_the_contract(cartpole_bundle, cartpole_ckpt):
    source = RuntimeSource(cartpole_bundle, TrainerCells(cartpole_ckpt, cartpole_bundle.policy_spec))
    with create("onnxruntime", source, "policy_sample") as rt:
        obs = np.zeros((3, 4), np.float32)
        with pytest.raises(FeedError, match="takes 2 inputs"):
            rt.infer(obs)
        with pytest.raises(FeedError, match="must be float32"):
            rt.infer(obs.astype(np.float64), np.zeros((3, 2), np.float32))
        with pytest.raises(FeedError, match="shape"):
            rt.infer(np.zeros((3, 5), np.float32), np.zeros((3, 2), np.float32))
        with pytest.raises(FeedError, match="batch size"):
            rt.infer(obs, np.zeros((2, 2), np.float32))


def test_unavailable_and_incompatible_runtimes_explain_themselves(cartpole_bundle, cartpole_ckpt):
    source = RuntimeSource(cartpole_bundle, TrainerCells(cartpole_ckpt, cartpole_bundle.policy_spec))
    reasons = availability(source)
    assert "mindspore_lite" in reasons["lite-python"]  # the PyPI Lite wheel is cp37-only
    assert RUNTIMES["ms-cell"].unavailable_reason(RuntimeSource(cartpole_bundle))
    if reasons["lite-mindir"] is None:
        with pytest.raises(IncompatibleModel, match=r"MindIR v3 .* reads <= v1; use the \.ms"):
            create("lite-mindir", source, "policy").open()
