"""Audit a field recording on the training box: ``verify --bundle B --audit RECORDING...``.

The device recorded what it fed its graph and what the graph answered (``inference.field``); here every chunk is
checked first (``inference.bundle.recording.index_recording``: a malformed, missing or duplicated chunk is one line,
exit 2, before any work), then the training path (the Cell from its checkpoint, in PyNative: verify's reference) runs on
each chunk's inputs as ``inference.compare.audit`` streams the recording, so memory is bounded by a chunk.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import msrl_consistency.runtimes  # noqa: F401 - registers ms-cell, the reference an audit reruns
from inference.bundle import Bundle
from inference.bundle.files import write_json_atomic
from inference.bundle.recording import Chunk, index_recording
from inference.compare.audit import AuditFacts, audit, only_graph, plot_timeline
from inference.compare.checks import VerifyResult
from inference.compare.judge.stats import Tolerance
from inference.runtimes.base import Runtime, RuntimeSource
from inference.runtimes.registry import create

BATCH = 8192  # rows per reference call: PyNative's cost is per call, memory per row
TRAINING_EPISODES = 100  # the last episodes of training, when the run has no final evaluation


def audit_recordings(
    bundle: Bundle, recordings: Sequence[Path], cells: Any, checkpoint: Path | None, *, device: str = "cpu",
    windows: int = 10, tolerance: str | None = None, overrides: Mapping[str, Tolerance] | None = None,
    localize: str = "auto", progress: Callable[[str], None] = lambda _m: None,
) -> tuple[VerifyResult, AuditFacts]:  # fmt: skip
    """Index the recordings (checked against ``bundle``), then compare them chunk by chunk with the reference."""
    from msrl_consistency.localization import CellLocalizer

    index = index_recording(recordings, bundle)
    progress(f"audit: {index.steps} recorded steps of {index.graph} ({len(index.chunks)} chunks, recorded by "
             f"{', '.join(index.runtimes)})")  # fmt: skip
    view = only_graph(bundle, index.graph)
    with create("ms-cell", RuntimeSource(view, cells, device), index.graph) as reference:
        return audit(bundle, index, lambda chunk: reference_outputs(reference, chunk), cells=cells,
                     checkpoint=checkpoint, windows=windows, training_returns=training_returns(checkpoint),
                     tolerance=tolerance, overrides=overrides, localizer=CellLocalizer(view, cells, device),
                     localize=localize, progress=progress)  # fmt: skip


def reference_outputs(reference: Runtime, chunk: Chunk) -> dict[str, np.ndarray]:
    """The training path's outputs on the chunk's recorded inputs, ``BATCH`` rows per call."""
    parts = [reference.infer(*(x[lo : lo + BATCH] for x in chunk.inputs)) for lo in range(0, len(chunk), BATCH)]
    return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}


def training_returns(checkpoint: Path | None) -> tuple[list[float], str]:
    """Training's final evaluation returns (``run.json``), else the returns of its last episodes (``episodes.csv``),
    with which of the two they are."""
    if checkpoint is None:
        return [], ""
    from inference.errors import UsageError
    from msrl_consistency.artifacts import run_dir as rd

    try:
        run = rd.read_run_json(checkpoint.parent)
    except UsageError:
        return [], ""
    if (run.get("eval") or {}).get("returns"):
        return [float(r) for r in run["eval"]["returns"]], "training's final evaluation"
    episodes = checkpoint.parent / "episodes.csv"
    if not episodes.is_file():
        return [], ""
    with open(episodes, newline="") as fh:
        rows = list(csv.DictReader(fh))
    returns = [float(r["return"]) for r in rows[-TRAINING_EPISODES:] if r.get("return")]
    return returns, f"training's last {len(returns)} episodes"


def audit_files(facts: AuditFacts) -> dict[str, Callable[[Path], bool]]:
    """The audit's files of the report set: ``audit.json`` (the recording, the windows, the actions, the NaN/inf
    steps, the observations' range, the returns) and ``audit_timeline.png``
    (``inference.report.writers.write_reports(extra=...)``)."""

    def facts_json(path: Path) -> bool:
        write_json_atomic(path, facts.to_dict())
        return True

    return {"audit": facts_json, "timeline": lambda path: plot_timeline(facts, path)}
