"""Runtime conformance: every runtime available here agrees with the training path on one bundle."""

from __future__ import annotations

import numpy as np
import pytest

from inference.compare.feeds import seeded_feeds
from inference.runtimes.base import FeedError, RuntimeSource
from inference.runtimes.lite import IncompatibleModel
from inference.runtimes.registry import REFERENCE, RUNTIMES, availability, create
from msrl_consistency.artifacts.cells import TrainerCells

# ONNX Runtime sums GEMMs in another order (measured ~1e-4 on logits, ~1e-3 on value outputs of size ~40).
ATOL = {"onnxruntime": 2e-3}
# The opt-in runtimes (Lite's ARM kernels under emulation) have their own tests: tests/test_lite_aarch64.py.
CONFORMING = [n for n in RUNTIMES if n not in ("lite-mindir", "lite-python", REFERENCE) and not RUNTIMES[n].opt_in]


@pytest.fixture(scope="module", params=["cartpole", "pendulum"])
def bundle_and_ckpt(request):
    return request.getfixturevalue(f"{request.param}_bundle"), request.getfixturevalue(f"{request.param}_ckpt")


@pytest.mark.slow
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


def test_unavailable_runtimes_explain_themselves(cartpole_bundle, monkeypatch, tmp_path):
    reasons = availability(RuntimeSource(cartpole_bundle))
    assert "needs the policy Cell" in reasons["ms-cell"] and "needs the policy Cell" in reasons["ms-graph"]
    lite_python = RUNTIMES["lite-python"]
    monkeypatch.setenv("MSRL_LITE_PYTHON", str(tmp_path / "no-such-python"))
    assert "cannot start" in lite_python.unavailable_reason(RuntimeSource(cartpole_bundle))
    for name, body, expected in [("without", "echo 'No module named mindspore_lite' >&2; exit 1", "does not import"),
                                 ("with", "echo 2.3.0", None)]:  # fmt: skip
        fake = tmp_path / f"python-{name}-lite"
        fake.write_text(f"#!/bin/sh\n{body}\n")
        fake.chmod(0o755)
        monkeypatch.setenv("MSRL_LITE_PYTHON", str(fake))
        reason = lite_python.unavailable_reason(RuntimeSource(cartpole_bundle))
        assert reason is None if expected is None else expected in reason
    monkeypatch.setenv("MSRL_LITE_RUNNER", str(tmp_path / "no-such-runner"))
    assert "no-such-runner" in availability(RuntimeSource(cartpole_bundle))["lite"]


def test_a_mindir_newer_than_the_runtime_reads_is_a_version_contract_failure(cartpole_bundle):
    from inference.lite.runner_info import runner_info

    info = runner_info()
    assert info is not None and info.max_mind_ir_version is not None, "build the runner: make lite"
    version = cartpole_bundle.graph("policy")["files"]["mindir"]["mind_ir_version"]
    runtime = create("lite-mindir", RuntimeSource(cartpole_bundle), "policy")
    if info.mindir_loads(version):  # a Lite new enough for this MindIR: it loads and runs
        with runtime:
            assert "action" in runtime.infer(np.zeros((2, 4), np.float32))
    else:
        with pytest.raises(IncompatibleModel, match=rf"MindIR v{version} .* reads <= v{info.max_mind_ir_version}"):
            runtime.open()
