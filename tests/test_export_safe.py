"""``agent/export_safe.py``'s ``ScaleAction``: host-side action scaling moved into the graph, where export keeps it."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import Tensor, nn

from msrl_consistency.agent.export_safe import ScaleAction

LOW, HIGH = [-2.0, 0.0], [2.0, 1.0]
RAW = np.array([[-3.0, 0.5], [0.25, 5.0], [1.5, -0.75]], np.float32)


class MeanAndValue(nn.Cell):
    """A team's policy: an action mean (the input itself) and a value."""

    def construct(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        return obs, obs.sum(axis=1)


class MeanOnly(nn.Cell):
    def construct(self, obs: Tensor) -> Tensor:
        return obs * 1.0


def expected(mode: str, rescale: bool = False) -> np.ndarray:
    low, high = np.float32(LOW), np.float32(HIGH)
    center, half = (high + low) / 2, (high - low) / 2
    if mode == "tanh":
        return center + half * np.tanh(RAW)
    return center + half * np.clip(RAW, -1.0, 1.0) if rescale else np.clip(RAW, low, high)


@pytest.mark.parametrize(("mode", "rescale"), [("clip", False), ("clip", True), ("tanh", False)])
def test_scale_action_appends_the_env_action_and_keeps_the_outputs(mode, rescale):
    mean, value, action = ScaleAction(MeanAndValue(), 0, LOW, HIGH, mode, rescale)(Tensor(RAW))
    np.testing.assert_array_equal(mean.asnumpy(), RAW)
    np.testing.assert_array_equal(value.asnumpy(), RAW.sum(axis=1))
    if mode == "tanh":  # MindSpore's CPU tanh is an approximation: tanh(5) came out 1.00001, beyond the bound
        np.testing.assert_allclose(action.asnumpy(), expected(mode), rtol=0, atol=1e-4)
    else:  # exact float32 arithmetic, always within the bounds
        np.testing.assert_array_equal(action.asnumpy(), expected(mode, rescale))
        assert (action.asnumpy() >= np.float32(LOW)).all() and (action.asnumpy() <= np.float32(HIGH)).all()


def test_scale_action_wraps_a_single_output_cell_and_survives_export(tmp_path):
    wrapped = ScaleAction(MeanOnly(), 0, LOW, HIGH, "clip", rescale=True)
    direct = [t.asnumpy() for t in wrapped(Tensor(RAW))]
    assert len(direct) == 2
    ms.export(wrapped, Tensor(shape=[None, 2], dtype=ms.float32), file_name=str(tmp_path / "scaled"),
              file_format="MINDIR")  # fmt: skip
    loaded = nn.GraphCell(ms.load(str(tmp_path / "scaled.mindir")))
    exported = [t.asnumpy() for t in loaded(Tensor(RAW))]
    np.testing.assert_array_equal(exported[1], direct[1])  # the deployed graph scales as the wrapped Cell does
    np.testing.assert_array_equal(direct[1], expected("clip", rescale=True))


def test_scale_action_refuses_bad_bounds_and_modes():
    with pytest.raises(ValueError, match="squash must be clip or tanh"):
        ScaleAction(MeanOnly(), 0, LOW, HIGH, "sigmoid")
    with pytest.raises(ValueError, match="must pair up with low < high"):
        ScaleAction(MeanOnly(), 0, [1.0, 0.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="must pair up"):
        ScaleAction(MeanOnly(), 0, [0.0], [1.0, 2.0])
