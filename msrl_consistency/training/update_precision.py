"""Mixed precision for the PPO update only: float32 master weights, a low-precision forward/backward, loss scaling.

What runs in ``fp16``/``bf16`` is the actor and critic MLPs inside the loss (``MLP.forward_as``): their float32
weights are cast on the fly, so the optimizer, its moments and every Parameter stay float32, and so do the
rollouts, the acting graph and every exported graph. The distribution math and the losses stay float32.

``fp16`` needs loss scaling (its smallest normal is 6e-5, small gradients underflow): the loss is multiplied by
a dynamic scale before the backward pass, gradients are divided by it after the AllReduce, and an update whose
gradients are not finite is skipped and halves the scale; ``SCALE_WINDOW`` finite updates in a row double it
(PyTorch ``GradScaler``'s rule and defaults). ``nn.TrainOneStepWithLossScaleCell`` cannot be used: on the CPU
backend it fails ("Unsupported op [NPUGetFloatStatusV2] on CPU"); ``amp.all_finite`` works on every backend.
``bf16`` has float32's exponent range and needs no scaling, but MindSpore 2.10's CPU backend has no bfloat16
Dense/MatMul kernel: ``compat.check_compute_dtype`` turns that into a clear error before training starts.
"""

from __future__ import annotations

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

PRECISIONS = ("fp32", "fp16", "bf16")
INIT_SCALE, SCALE_FACTOR, SCALE_WINDOW = 2.0**16, 2.0, 2000


def compute_dtype(precision: str) -> ms.dtype | None:
    """The dtype the update's MLPs run in; ``None`` for fp32 (the unchanged float32 graph)."""
    return {"fp32": None, "fp16": ms.float16, "bf16": ms.bfloat16}[precision]


def needs_loss_scale(precision: str) -> bool:
    return precision == "fp16"


class LossScale(nn.Cell):
    """Dynamic loss scale as Parameters (saved in ``resume.state`` with the rest of the train step)."""

    def __init__(self, init: float = INIT_SCALE, factor: float = SCALE_FACTOR, window: int = SCALE_WINDOW) -> None:
        super().__init__()
        self.scale = Parameter(Tensor(init, ms.float32), name="loss_scale", requires_grad=False)
        self.good_steps = Parameter(Tensor(0, ms.int32), name="good_steps", requires_grad=False)
        self.skipped = Parameter(Tensor(0, ms.int32), name="skipped_updates", requires_grad=False)
        self.factor, self.window = factor, window

    def adjust(self, finite: Tensor) -> Tensor:
        """Grow after ``window`` finite updates in a row, halve (not below 1) and count a skip otherwise."""
        grow = self.good_steps >= self.window - 1
        scale = ops.select(
            finite,
            ops.select(grow, self.scale * self.factor, self.scale),
            ops.maximum(self.scale / self.factor, ops.ones((), ms.float32)),
        )
        zero = ops.zeros((), ms.int32)
        good = ops.select(finite, ops.select(grow, zero, self.good_steps + 1), zero)
        skipped = self.skipped + ops.select(finite, zero, ops.ones((), ms.int32))
        finite = ops.depend(finite, ops.assign(self.scale, scale))
        finite = ops.depend(finite, ops.assign(self.good_steps, good))
        return ops.depend(finite, ops.assign(self.skipped, skipped))


class ScaledLoss(nn.Cell):
    """``loss × scale`` for the backward pass (the aux metrics stay unscaled)."""

    def __init__(self, loss_net: nn.Cell) -> None:
        super().__init__()
        self.loss_net = loss_net

    def construct(
        self,
        x: Tensor,
        actions: Tensor,
        old_logp: Tensor,
        adv: Tensor,
        returns: Tensor,
        old_values: Tensor,
        scale: Tensor,
    ) -> tuple[Tensor, Tensor]:
        loss, aux = self.loss_net(x, actions, old_logp, adv, returns, old_values)
        return loss * scale, aux
