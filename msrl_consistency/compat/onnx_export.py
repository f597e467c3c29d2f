"""MindSpore's ONNX exporter's gaps: ops it cannot write, exported through markers, and what to write instead."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn


# -- the ONNX exporter's gaps ----------------------------------------------------------------------------------
# MindSpore 2.10's ONNX exporter has no ``Erf`` and no ``Elu``: exact GELU (``nn.GELU(approximate=False)``,
# ``ops.gelu(x, 'none')``), ``ops.erf`` and ``nn.ELU`` (Dreamer's actor) fail to export, although ONNX, ONNX Runtime
# and Lite all have the ops. ``onnx_ops_marked`` has them compute a ``Clip`` with bounds no policy uses instead (an
# op the exporter writes and never folds into its neighbours, as it folds a ``Mul`` by a constant), one pair of
# bounds per op; ``onnx_patterns.restore_marked`` turns each such ``Clip`` back into the op. Only the ONNX export
# sees the markers; the Cell computes the real functions. (MindSpore's CPU ``Elu`` only takes ``alpha = 1``.)
def _float32(bits: int) -> float:
    return float(np.frombuffer(np.uint32(bits).tobytes(), np.float32)[0])


ONNX_MARKERS = {
    "Erf": (_float32(0xFF1E2F3B), _float32(0x7F1E2F3B)),
    "Elu": (_float32(0xFF1E2F3C), _float32(0x7F1E2F3C)),
}
# Ops the exporter refuses, with what to write instead (shown when an ONNX export fails on one of them).
ONNX_EXPORT_HINTS = {
    "Erf": "ops.erf / exact GELU reached through a Primitive created in __init__ (ops.Erf()) cannot be exported; "
           "call ops.erf, ops.gelu(x, approximate='none') or nn.GELU(approximate=False) in construct, which export "
           "writes as ONNX Erf",
    "Elu": "an ops.Elu() Primitive cannot be exported; nn.ELU() (and nn.Dense(..., activation=nn.ELU())) export as "
           "ONNX Elu",
    "GeluExt": "mint's GELU (mint.nn.GELU, mint.nn.functional.gelu) has no ONNX export in MindSpore; use "
               "nn.GELU(approximate=False) (exact) or nn.GELU() (tanh), which export handles",
}  # fmt: skip
_ERF_LOW, _ERF_HIGH = ONNX_MARKERS["Erf"]
_ELU_LOW, _ELU_HIGH = ONNX_MARKERS["Elu"]


def _erf_marked(x: Any) -> Any:
    return ms.ops.clamp(x, _ERF_LOW, _ERF_HIGH)


def _elu_marked(self: Any, x: Any) -> Any:
    return ms.ops.clamp(x, _ELU_LOW, _ELU_HIGH)


@contextlib.contextmanager
def onnx_ops_marked() -> Iterator[None]:
    """``erf`` and ``nn.ELU`` as their marker ``Clip`` for the graphs compiled in the block (ONNX export only)."""
    from mindspore.ops.auto_generate import gen_ops_def
    from mindspore.ops.function import nn_func

    # ``ops.gelu`` calls ``nn_func.erf_``; ``ops.erf`` and ``mint.erf`` (however imported) call ``gen_ops_def.erf_op``
    targets = [(nn_func, "erf_", _erf_marked), (gen_ops_def, "erf_op", _erf_marked), (nn.ELU, "construct", _elu_marked)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in targets if hasattr(owner, name)]
    for owner, name, marked in targets:
        if hasattr(owner, name):
            setattr(owner, name, marked)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def onnx_export_hint(message: str) -> str:
    """What to write instead, for an exporter refusal ``Can not find key OP in convert map`` (empty if unknown)."""
    found = re.search(r"Can not find key (\w+) in convert map", message)
    if found:
        return ONNX_EXPORT_HINTS.get(found.group(1), "")
    if "`axis` is out of range" in message:
        return ("MindSpore's ONNX exporter takes no negative axis for some ops (Split: P.Split(-1, 2)); count the axis "
                "from the front (P.Split(1, 2) for the last of two dims)")  # fmt: skip
    return ""
