"""Tensor metadata and feed checking shared by every runtime, the Lite client included. NumPy only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class TensorMeta:
    """A graph input or output; ``-1`` marks a dynamic dimension (the batch).

    Lite reports output shapes before any inference, and they can be incomplete (a dynamic-batch ``[-1, 2]``
    output may read ``(-1,)``); only input shapes are used to check feeds.
    """

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @classmethod
    def from_manifest(cls, entry: dict[str, Any]) -> TensorMeta:
        return cls(entry["name"], np.dtype(entry["dtype"]), tuple(int(d) for d in entry["shape"]))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype.name, "shape": list(self.shape)}


class FeedError(ValueError):
    """An input does not match the graph's declared count, name, dtype or shape, or a batch exceeds the Lite
    runner's row cap (bad input: exit 2). Every runtime raises this one class, the Lite client included."""

    exit_code = 2


def check_feeds(inputs: Sequence[TensorMeta], arrays: Sequence[Any], where: str) -> None:
    """Raise ``FeedError`` unless ``arrays`` match ``inputs`` in count, dtype, rank and fixed dims, with one batch."""
    if len(arrays) != len(inputs):
        names = ", ".join(m.name for m in inputs)
        raise FeedError(f"{where} takes {len(inputs)} inputs ({names}), got {len(arrays)}")
    batch = None
    for meta, arr in zip(inputs, arrays, strict=True):
        if not isinstance(arr, np.ndarray) or arr.dtype != meta.dtype:
            got = getattr(arr, "dtype", type(arr).__name__)
            raise FeedError(f"{where} input {meta.name!r} must be {meta.dtype}, got {got}")
        fits = arr.ndim == len(meta.shape) and all(m in (-1, s) for m, s in zip(meta.shape, arr.shape, strict=True))
        if not fits:
            raise FeedError(f"{where} input {meta.name!r} must have shape {meta.shape}, got {arr.shape}")
        if batch is not None and arr.shape[0] != batch:
            raise FeedError(f"{where} inputs disagree on the batch size ({batch} vs {arr.shape[0]})")
        batch = arr.shape[0]
