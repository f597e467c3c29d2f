"""Audit a field recording on the training box: ``verify --bundle B --audit RECORDING...``.

The device recorded what it fed its graph and what the graph answered (``inference.field``); here the training
path (the Cell from its checkpoint, in PyNative: verify's reference) runs on the very same inputs, and
``inference.compare.audit`` compares the two as verify compares a runtime, per time window too, with the field's
observations measured against training's statistics and its returns against training's evaluations.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import msrl_consistency.runtimes  # noqa: F401 - registers ms-cell, the reference an audit reruns
from inference.bundle import Bundle
from inference.compare.audit import AuditFacts, audit, only_graph, plot_timeline
from inference.compare.checks import VerifyResult
from inference.field import read_recording
from inference.files import write_json_atomic
from inference.runtimes.base import RuntimeSource
from inference.runtimes.registry import create

BATCH = 8192  # rows per reference call: PyNative's cost is per call, memory per row
TRAINING_EPISODES = 100  # the last episodes of training, when the run has no final evaluation


def audit_recordings(
    bundle: Bundle, recordings: Sequence[Path], cells: Any, checkpoint: Path | None, *, device: str = "cpu",
    windows: int = 10, tolerance: str | None = None, progress: Callable[[str], None] = lambda _m: None,
) -> tuple[VerifyResult, AuditFacts]:  # fmt: skip
    """Read the recordings (checked against ``bundle``), run the reference on their inputs, compare."""
    from msrl_consistency.localization import CellLocalizer

    rec = read_recording(recordings, bundle)
    progress(f"audit: {len(rec)} recorded steps of {rec.graph} ({len(rec.chunks)} chunks, recorded by {rec.runtime})")
    view = only_graph(bundle, rec.graph)
    with create("ms-cell", RuntimeSource(view, cells, device), rec.graph) as reference:
        parts = [reference.infer(*(x[lo : lo + BATCH] for x in rec.inputs)) for lo in range(0, len(rec), BATCH)]
    outputs = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
    result, facts = audit(bundle, rec, outputs, cells=cells, checkpoint=checkpoint, windows=windows,
                          training_returns=training_returns(checkpoint), tolerance=tolerance,
                          localizer=CellLocalizer(view, cells, device))  # fmt: skip
    return result, facts


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
    """The audit's files of the report set: ``audit.json`` (the windows, the observations' range, the returns)
    and ``audit_timeline.png`` (``inference.report.writers.write_reports(extra=...)``)."""

    def facts_json(path: Path) -> bool:
        write_json_atomic(path, facts.to_dict())
        return True

    return {"audit": facts_json, "timeline": lambda path: plot_timeline(facts, path)}
