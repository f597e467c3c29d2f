"""Cells as export and the runtimes meet them: fp16 layers, dtypes, outputs (``None`` entries, nested tuples), a
Cell that has no kernel on this device."""

from __future__ import annotations

import re
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn

from msrl_consistency.compat.graph import execution_mode


def layers_to_float16(cell: nn.Cell, own_parameters: bool = False) -> nn.Cell:
    """Every sub-Cell of ``cell`` computes in fp16; ``cell``'s own ``construct`` and methods do not.

    ``to_float`` on ``cell`` itself would, in graph mode, also cast the ops of its methods (the sampling noise's
    transform among them) to fp16: measured, an fp16 graph then drew infinite Gumbel samples where PyNative did not.
    ``own_parameters``: ``cell``'s own Parameters become fp16 too, for a ``construct`` that combines them with fp16
    layer outputs in ops that take one dtype (an old-style actor's ``BiasAdd(zeros_like(mean), sigma_bias)``).
    """
    from mindspore.nn.layer.rnn_cells import RNNCellBase

    for _, sub in cell.cells_and_names():
        if sub is not cell:
            sub.to_float(ms.float16)
            if isinstance(sub, RNNCellBase):  # GRUCell/LSTMCell/RNNCell multiply their raw weights (no cast of their
                for param in sub.get_parameters(expand=False):  # own): fp16 inputs need fp16 weights
                    param.set_dtype(ms.float16)
    if own_parameters:
        for param in cell.get_parameters(expand=False):
            param.set_dtype(ms.float16)
    return cell


def ms_dtype(dtype: np.dtype) -> Any:
    """MindSpore's dtype for a NumPy one (``mindspore.uint8`` for ``uint8``...)."""
    from mindspore.common import dtype as mstype

    return mstype.pytype_to_dtype(np.dtype(dtype).type)


def as_tuple(outputs: Any) -> tuple[Any, ...]:
    """A Cell's outputs as a flat tuple: a single-output Cell (or GraphCell) returns a bare Tensor; a nested tuple
    (XuanCe's DRQN returns ``(..., (h, c))``) is flattened in order; ``None`` entries (tianshou's ``(logits, None)``
    for "no state") are not outputs."""
    if not isinstance(outputs, tuple | list):
        return (outputs,)
    return tuple(o for out in outputs for o in as_tuple(out) if o is not None)


def wrapped(make: Any, inner: nn.Cell, *args: Any) -> nn.Cell:
    """``make(inner, *args)``, a Cell holding ``inner``, with ``inner``'s Parameters keeping their names: a built
    Cell assigned to another renames its Parameters (``inner.fc.weight``), which would rename the caller's own Cell
    object and every name its checkpoint, MindIR and ONNX carry."""
    names = [(p, p.name) for p in inner.get_parameters()]
    cell = make(inner, *args)
    for param, name in names:
        param.name = name
    return cell


class NoneDropped(nn.Cell):
    """``inner``'s outputs flat and without ``None`` entries: neither MindIR nor ONNX export can write a ``None``
    output ("Out of the size of the tuple", "Unsupported network output type None")."""

    def __init__(self, inner: nn.Cell) -> None:
        super().__init__()
        self.inner = inner

    def construct(self, *inputs: Any) -> Any:
        outs = self.inner(*inputs)
        kept = ()
        for out in outs:  # unrolled at compile time; a None entry is a constant
            if isinstance(out, tuple):  # one level of nesting: (q, (h, c))
                for inner in out:
                    if inner is not None:
                        kept = kept + (inner,)
            elif out is not None:
                kept = kept + (out,)
        return kept


# How MindSpore says an op has no kernel on the device it runs on (a Cell that cannot run here, whatever its inputs)
_NO_KERNEL = (re.compile(r"Unsupported op \[(\w+)\] on"), re.compile(r"'(\w+)' is not supported on this device"),
              re.compile(r"()Kernel select failed"))  # fmt: skip


def no_kernel_here(exc: BaseException) -> str | None:
    """The op MindSpore has no kernel for on this device, from its error (None: another error)."""
    for pattern in _NO_KERNEL:
        found = pattern.search(str(exc))
        if found is not None:
            return found.group(1) or "an op"
    return None


def exportable(cell: nn.Cell, examples: list[Any]) -> nn.Cell:
    """``cell``, or a ``NoneDropped`` wrapper of it when it returns ``None`` entries or nested tuples (run once on
    ``examples``)."""
    with execution_mode(graph=False):
        outs = cell(*examples)
    if isinstance(outs, tuple | list) and any(o is None or isinstance(o, tuple | list) for o in outs):
        return wrapped(NoneDropped, cell)
    return cell
