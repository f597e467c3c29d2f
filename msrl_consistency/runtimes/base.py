"""The runtime contract, after Polygraphy's runners: open → metadata → checked infer → close.

A runtime whose dependency is missing is *unavailable with a reason*; it never raises ImportError
into the caller. Feeds are checked against the graph's declared inputs before anything runs.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from inference.bundle import Bundle
from msrl_consistency.errors import MsrlError, RuntimeUnavailable, UsageError


@dataclass(frozen=True)
class TensorMeta:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]  # -1 = dynamic

    @classmethod
    def from_manifest(cls, entry: dict[str, Any]) -> TensorMeta:
        return cls(entry["name"], np.dtype(entry["dtype"]), tuple(entry["shape"]))


class FeedError(UsageError):
    """An input does not match the graph's declared name, dtype or shape."""


class InferenceFailed(MsrlError):
    """The runtime loaded the graph but failed (or hung) while running it."""

    exit_code = 1


@dataclass
class RuntimeSource:
    """Where runtimes find their graph: the bundle, and the training checkpoint for the Cell-based paths."""

    bundle: Bundle
    checkpoint: Path | None = None
    device: str = "cpu"
    device_id: int = 0


class Runtime(abc.ABC):
    """Loads one graph (``policy`` or ``policy_sample``) of a bundle and runs it."""

    name: ClassVar[str]
    description: ClassVar[str]
    fmt: ClassVar[str | None] = None  # the bundle file format it loads; None for the checkpoint-based Cells

    def __init__(self, source: RuntimeSource, graph: str) -> None:
        self.source, self.graph = source, graph
        entry = source.bundle.graph(graph)
        self.inputs = [TensorMeta.from_manifest(t) for t in entry["inputs"]]
        self.outputs = [TensorMeta.from_manifest(t) for t in entry["outputs"]]
        self._open = False

    # -- lifecycle ------------------------------------------------------------------------------------
    @classmethod
    def unavailable_reason(cls, source: RuntimeSource) -> str | None:
        """None when this runtime can run here; otherwise why not (missing package, binary, device...)."""
        return None

    @classmethod
    def why_not(cls, source: RuntimeSource) -> str | None:
        """``unavailable_reason`` plus whether the bundle has this runtime's file for every graph."""
        if cls.fmt is not None:
            for graph in source.bundle.manifest["graphs"].values():
                entry = graph["files"].get(cls.fmt, {"skipped": "not exported"})
                if "file" not in entry:
                    return f"the bundle has no .{cls.fmt} graph ({entry.get('skipped', 'not exported')})"
        return cls.unavailable_reason(source)

    def model_path(self) -> Path:
        """This runtime's file (format ``fmt``) for its graph in the bundle."""
        assert self.fmt is not None, f"{self.name} loads no bundle file"
        return self.source.bundle.file(self.graph, self.fmt)

    def open(self) -> Runtime:
        reason = self.why_not(self.source)
        if reason:
            raise RuntimeUnavailable(f"{self.name}: {reason}")
        self._load()
        self._open = True
        return self

    def close(self) -> None:
        if self._open:
            self._unload()
            self._open = False

    def __enter__(self) -> Runtime:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def versions(self) -> dict[str, Any]:
        """Versions that matter for the compatibility contract with the exporter."""
        return {}

    # -- inference ------------------------------------------------------------------------------------
    def infer(self, *arrays: np.ndarray) -> dict[str, np.ndarray]:
        """Run one batch; returns outputs keyed by the contract's output names."""
        if not self._open:
            raise InferenceFailed(f"{self.name}: infer() before open()")
        self.check_feeds(arrays)
        outs = self._run([np.ascontiguousarray(a) for a in arrays])
        if len(outs) != len(self.outputs):
            raise InferenceFailed(f"{self.name}: graph returned {len(outs)} outputs, expected {len(self.outputs)}")
        return {meta.name: np.asarray(out) for meta, out in zip(self.outputs, outs, strict=True)}

    def check_feeds(self, arrays: tuple[np.ndarray, ...] | list[np.ndarray]) -> None:
        if len(arrays) != len(self.inputs):
            raise FeedError(f"{self.graph} takes {len(self.inputs)} inputs ({self._names()}), got {len(arrays)}")
        batch = None
        for meta, arr in zip(self.inputs, arrays, strict=True):
            if not isinstance(arr, np.ndarray) or arr.dtype != meta.dtype:
                got = getattr(arr, "dtype", type(arr).__name__)
                raise FeedError(f"{self.graph} input {meta.name!r} must be {meta.dtype}, got {got}")
            fixed_ok = arr.ndim == len(meta.shape) and all(
                m in (-1, s) for m, s in zip(meta.shape, arr.shape, strict=True)
            )
            if not fixed_ok:
                raise FeedError(f"{self.graph} input {meta.name!r} must have shape {meta.shape}, got {arr.shape}")
            if batch is not None and arr.shape[0] != batch:
                raise FeedError(f"{self.graph} inputs disagree on the batch size ({batch} vs {arr.shape[0]})")
            batch = arr.shape[0]

    def _names(self) -> str:
        return ", ".join(m.name for m in self.inputs)

    @abc.abstractmethod
    def _load(self) -> None: ...

    @abc.abstractmethod
    def _run(self, arrays: list[np.ndarray]) -> list[np.ndarray]: ...

    def _unload(self) -> None:
        return None
