"""A bundle's graphs run both ways Lite can run them: on the calling thread (inline, ``runner/inline_run.h``) and
handed off to Lite's actor thread, as Lite schedules them itself. The two must give the same bits; where they do
not, or where asking for inline runs does not take (a Lite whose MindRT does not bind to ours), the evidence says so.

``doctor`` runs it on this box's Lite; the emulated aarch64 runtime runs it through its runner. NumPy only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle import Bundle
from inference.compare.feeds import seeded_feeds

ROWS = 64  # one batch of seeded rows, then the first SINGLES of them one at a time (batch 1 takes its own kernels)
SINGLES = 8

Opener = Callable[[Path, bool], Any]  # (model file, inline) -> an open LiteModel or LiteRunner


@dataclass
class InlineComparison:
    """What running every graph both ways showed: ``differences`` (one line of evidence per differing output) and
    ``not_inline`` (graphs whose inline-requested model still ran on Lite's actor thread) empty means bitwise equal
    with the graph on the calling thread."""

    graphs: list[str]
    rows: int
    calls: int = 0
    differences: list[str] = field(default_factory=list)
    not_inline: list[str] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not self.differences

    def summary(self) -> str:
        what = f"{self.calls} calls per way ({self.rows} seeded rows as a batch and {SINGLES} singly) on " + ", ".join(
            self.graphs
        )
        if self.differences:
            return f"inline and hand-off differ: {'; '.join(self.differences[:4])} ({what})"
        if self.not_inline:
            return f"inline runs did not take for {', '.join(self.not_inline)}: only the hand-off ran ({what})"
        return f"bitwise equal: {what}"


def _rows(x: np.ndarray) -> np.ndarray:
    return x.reshape(x.shape[0], -1) if x.ndim and x.size else x.reshape(1, -1)


def _difference(graph: str, name: str, a: np.ndarray, b: np.ndarray, call: str) -> str | None:
    """One line naming how the inline answer ``a`` differs from the hand-off's ``b`` (None: same bits)."""
    if a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes():
        return None
    if a.shape != b.shape or a.dtype != b.dtype:
        return f"{graph}:{name} ({call}): {a.dtype}{list(a.shape)} inline vs {b.dtype}{list(b.shape)} hand-off"
    rows_a, rows_b = _rows(a), _rows(b)
    differ = np.array([ra.tobytes() != rb.tobytes() for ra, rb in zip(rows_a, rows_b, strict=True)])
    first = int(np.argmax(differ))
    with np.errstate(invalid="ignore"):
        diff = np.abs(rows_a.astype(np.float64) - rows_b.astype(np.float64))
    worst = float(np.nanmax(diff)) if np.isfinite(diff).any() else float("nan")
    col = int(np.argmax(rows_a[first] != rows_b[first])) if rows_a.shape[1] else 0
    return (f"{graph}:{name} ({call}): {int(differ.sum())} of {len(differ)} rows differ, max |diff| {worst:.3g}; "
            f"row {first}: {rows_a[first, col]!r} inline vs {rows_b[first, col]!r} hand-off")  # fmt: skip


@contextmanager
def _opened(open_model: Opener, path: Path, inline: bool) -> Iterator[Any]:
    model = open_model(path, inline)
    try:
        yield model
    finally:
        model.close()


def compare_inline(bundle: Bundle, files: dict[str, Path], open_model: Opener, seed: int = 0) -> InlineComparison:
    """Every graph of ``files`` (graph -> the model file Lite loads) opened twice, inline and handed off, fed the
    same seeded rows (``ROWS`` as one batch, then the first ``SINGLES`` one by one), outputs compared bit for bit."""
    feeds = seeded_feeds(bundle, ROWS, seed=seed)
    result = InlineComparison(list(files), len(feeds))
    for graph, path in files.items():
        arrays = feeds.graph_inputs(bundle, graph)
        calls = [("batch", arrays)] + [(f"row {k}", [a[k : k + 1] for a in arrays]) for k in range(SINGLES)]
        with _opened(open_model, path, True) as inline, _opened(open_model, path, False) as handoff:
            for label, feed in calls:
                a, b = inline.infer(*feed), handoff.infer(*feed)
                for name in sorted(set(a) | set(b)):
                    if name not in a or name not in b:
                        result.differences.append(f"{graph}:{name} ({label}): an output of one way only")
                        continue
                    line = _difference(graph, name, a[name], b[name], label)
                    if line:
                        result.differences.append(line)
            if not inline.runs_inline:
                result.not_inline.append(graph)
        result.calls = len(calls)
    return result
