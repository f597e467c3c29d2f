"""The runtime contract, after Polygraphy's runners: open → metadata → checked infer → close.

A runtime whose dependency is missing is *unavailable with a reason*; it never raises ImportError
into the caller. Feeds are checked against the graph's declared inputs before anything runs.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from inference.bundle import Bundle
from inference.bundle.tensors import FeedError, TensorMeta, check_feeds
from inference.errors import MsrlError, RuntimeUnavailable

__all__ = [
    "CellProvider",
    "FeedError",
    "InferenceFailed",
    "Runtime",
    "RuntimeDied",
    "RuntimeHung",
    "RuntimeSource",
    "TensorMeta",
]

# Graph name -> the MindSpore Cell that computes it (the training path). Built by whoever knows the policy:
# our trainer's checkpoint loader, a user's ``MODULE:FACTORY``, or a Cell object handed to the library API.
CellProvider = Callable[[str], Any]


class InferenceFailed(MsrlError):
    """The runtime loaded the graph but failed (or hung) while running it (a failing check inside verify)."""


class RuntimeDied(InferenceFailed):
    """The runtime's process was killed from outside (SIGKILL, SIGTERM, the OOM killer) twice in a row: not a
    verdict on the graph, which was not judged (verify reports it as an error: exit 3)."""

    status = "died"  # the runtime's status in the report
    detail = (
        "killed from outside (a signal, the OOM killer), not by the graph: the bundle was not judged on this runtime"
    )


class RuntimeHung(RuntimeDied):
    """The runtime gave no answer within its wait (the timeout, plus what the request's rows cost at the model's
    measured rate): a slow host and a hang look alike from outside, so the graph is not judged (exit 3)."""

    status = "hung"
    detail = (
        "no answer within the wait (the timeout plus the request's measured cost): a hang or a host too slow to "
        "tell from one; the bundle was not judged on this runtime"
    )


@dataclass
class RuntimeSource:
    """Where runtimes find their graph: the bundle's files, and the policy Cells for the Cell-based paths."""

    bundle: Bundle
    cells: CellProvider | None = None
    device: str = "cpu"
    device_id: int = 0


class Runtime(abc.ABC):
    """Loads one graph (``policy`` or ``policy_sample``) of a bundle and runs it."""

    name: ClassVar[str]
    description: ClassVar[str]
    fmt: ClassVar[str | None] = None  # the bundle file format it loads; None for the checkpoint-based Cells
    opt_in: ClassVar[bool] = False  # run only when named (--runtimes/--require), e.g. under instruction emulation

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
        """``unavailable_reason`` plus whether the bundle has this runtime's file for every graph (a file that
        failed at export is not "unavailable": ``export_failure`` reports it as a failure)."""
        if cls.fmt is not None:
            for graph in source.bundle.manifest["graphs"].values():
                entry = graph["files"].get(cls.fmt, {"skipped": "not exported"})
                if "file" not in entry and "failed" not in entry:
                    return f"the bundle has no .{cls.fmt} graph ({entry.get('skipped', 'not exported')})"
        return cls.unavailable_reason(source)

    @classmethod
    def export_failure(cls, source: RuntimeSource) -> str | None:
        """Why this runtime's file failed at export (the manifest says so), if it did."""
        return None if cls.fmt is None else source.bundle.export_failure(cls.fmt)

    def model_path(self) -> Path:
        """This runtime's file (format ``fmt``) for its graph in the bundle."""
        assert self.fmt is not None, f"{self.name} loads no bundle file"
        return self.source.bundle.file(self.graph, self.fmt)

    def open(self) -> Runtime:
        """Load the graph; a runtime already open stays as it is (its compiled graphs too)."""
        if self._open:
            return self
        reason = self.why_not(self.source)
        if reason:
            raise RuntimeUnavailable(f"{self.name}: {reason}")
        if self.fmt is not None:  # the file loaded is the file the manifest's hash names, now, not at load_bundle
            self.source.bundle.recheck(self.model_path())
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

    def model_input_dtypes(self) -> list[np.dtype] | None:
        """The input dtypes the loaded model itself declares (after ``open``), when the runtime can tell: verify
        compares them with the contract's, since a runtime that casts an input silently is a finding."""
        return None

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
        check_feeds(self.inputs, arrays, self.graph)

    @abc.abstractmethod
    def _load(self) -> None: ...

    @abc.abstractmethod
    def _run(self, arrays: list[np.ndarray]) -> list[np.ndarray]: ...

    def _unload(self) -> None:
        return None
