"""What each runtime makes of an all-NaN observation row (the README states this; the test keeps it true).

Lite (.ms) and MindSpore (MindIR) map the NaN row to finite logits (the in-graph clip of the normalised
observation turns NaN into a bound); ONNX Runtime propagates NaN. A healthy row is finite everywhere.
"""

from __future__ import annotations

import numpy as np
import pytest

from inference.lite.client import LiteRunner
from inference.lite.common import runner_available


def _obs(bundle) -> np.ndarray:
    obs = np.zeros((2, bundle.graph("policy")["inputs"][0]["shape"][-1]), np.float32)
    obs[0] = np.nan
    return obs


@pytest.mark.skipif(not runner_available()[0], reason=runner_available()[1])
def test_lite_maps_a_nan_row_to_finite_logits(cartpole_bundle):
    with LiteRunner(cartpole_bundle.file("policy", "ms")) as r:
        logits = r.infer(_obs(cartpole_bundle))["logits"]
    assert np.isfinite(logits).all()


def test_mindir_maps_a_nan_row_to_finite_logits(cartpole_bundle):
    import mindspore as ms

    graph = ms.nn.GraphCell(ms.load(str(cartpole_bundle.file("policy", "mindir"))))
    names = [o["name"] for o in cartpole_bundle.graph("policy")["outputs"]]
    logits = dict(zip(names, (o.asnumpy() for o in graph(ms.Tensor(_obs(cartpole_bundle)))), strict=True))["logits"]
    assert np.isfinite(logits).all()


def test_onnxruntime_returns_nan_for_a_nan_row(cartpole_bundle):
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(str(cartpole_bundle.file("policy", "onnx")), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    out = dict(zip(names, session.run(None, {session.get_inputs()[0].name: _obs(cartpole_bundle)}), strict=True))
    assert np.isnan(out["logits"][0]).all() and np.isfinite(out["logits"][1]).all()
