"""Make a team's policy export-safe: move host-side pre/post-processing into the graph around their Cell.

Teams often normalise observations with NumPy arrays before calling their Cell and rescale its output to the
env's bounds afterwards. ``mindspore.export`` writes only the Cell, so the deployed graph silently sees raw
observations and returns unscaled actions. Wrapping the Cell puts both steps inside the graph, where export
carries them (before/after in ``examples/bring-your-own/``). The wrappers hold their statistics as constant
Tensors, not Parameters, so the team's checkpoint of the bare Cell still loads strictly into the wrapped one.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from mindspore import Tensor, nn, ops

from msrl_consistency.agent.preprocess import NORM_EPS


class NormalizeObservation(nn.Cell):
    """``inner(clip((obs - mean) / sqrt(var + eps), -clip, clip))``, with the team's frozen statistics.

    The arithmetic is float32 in the same order as the usual NumPy code
    ``np.clip((obs - mean) / np.sqrt(var + eps), -clip, clip)``, so both give the same bits.
    """

    def __init__(
        self, inner: nn.Cell, mean: Sequence[float], var: Sequence[float], clip: float | None = 10.0,
        eps: float = NORM_EPS,
    ) -> None:  # fmt: skip
        super().__init__()
        mean_arr, var_arr = np.asarray(mean, np.float32), np.asarray(var, np.float32)
        if mean_arr.shape != var_arr.shape or mean_arr.ndim != 1:
            raise ValueError(f"mean {mean_arr.shape} and var {var_arr.shape} must be 1-D of the same length")
        if (var_arr < 0).any():
            raise ValueError("var must be non-negative")
        self.inner = inner
        self.mean = Tensor(mean_arr)
        self.std = Tensor(np.sqrt(var_arr + np.float32(eps)))
        self.clip = None if clip is None else float(clip)

    def construct(self, obs: Tensor) -> Tensor:
        x = (obs - self.mean) / self.std
        if self.clip is not None:
            x = ops.clamp(x, -self.clip, self.clip)
        return self.inner(x)


class ScaleAction(nn.Cell):
    """The wrapped Cell's outputs plus one more, the env action: output ``index`` mapped to ``[low, high]``.

    ``squash``: ``clip`` clips to the bounds (with ``rescale=True`` the raw value lives in [-1, 1] and is mapped
    linearly first), ``tanh`` maps through tanh. The same rules as a contract's ``[action] squash``.
    """

    def __init__(
        self, inner: nn.Cell, index: int, low: Sequence[float], high: Sequence[float], squash: str = "clip",
        rescale: bool = False,
    ) -> None:  # fmt: skip
        super().__init__()
        if squash not in ("clip", "tanh"):
            raise ValueError(f"squash must be clip or tanh, got {squash!r}")
        low_arr, high_arr = np.asarray(low, np.float32), np.asarray(high, np.float32)
        if low_arr.shape != high_arr.shape or (low_arr >= high_arr).any():
            raise ValueError(f"low {low_arr.tolist()} and high {high_arr.tolist()} must pair up with low < high")
        self.inner, self.index, self.mode, self.rescale = inner, index, squash, rescale
        self.low, self.high = Tensor(low_arr), Tensor(high_arr)
        self.center, self.half = Tensor((high_arr + low_arr) / 2), Tensor((high_arr - low_arr) / 2)

    def construct(self, obs: Tensor) -> tuple[Tensor, ...]:
        outs = self.inner(obs)
        if not isinstance(outs, tuple):
            outs = (outs,)
        raw = outs[self.index]
        if self.mode == "tanh":
            action = self.center + self.half * ops.tanh(raw)
        elif self.rescale:
            action = self.center + self.half * ops.clamp(raw, -1.0, 1.0)
        else:
            action = ops.clamp(raw, self.low, self.high)
        return outs + (action,)
