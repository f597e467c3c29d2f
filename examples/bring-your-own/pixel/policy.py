"""A pixel policy: a small CNN on uint8 (16, 16, 3) camera frames, with the scaling to [0, 1] and the HWC to CHW
transpose inside the graph, so the device feeds the camera's bytes as they are."""

from __future__ import annotations

from pathlib import Path

import mindspore as ms
from mindspore import Tensor, nn, ops

HERE = Path(__file__).resolve().parent


class PixelPolicy(nn.Cell):
    """frames [batch, 16, 16, 3] uint8 -> logits [batch, 2]."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, pad_mode="valid", has_bias=True)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, pad_mode="valid", has_bias=True)
        self.fc = nn.Dense(16 * 3 * 3, 2)

    def construct(self, frames: Tensor) -> Tensor:
        x = ops.transpose(frames.astype(ms.float32) / 255.0, (0, 3, 1, 2))
        x = ops.relu(self.conv2(ops.relu(self.conv1(x))))
        return self.fc(x.reshape(x.shape[0], -1))


def make_policy() -> PixelPolicy:
    ms.set_seed(0)
    return PixelPolicy()
