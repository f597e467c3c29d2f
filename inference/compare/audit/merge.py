"""verify's comparison of one runtime, run chunk by chunk on a recording and merged into one check.

An audit streams a recording: each chunk is compared with verify's own machinery (``runtime_check.check_runtime``:
statistics, flips judged against the tolerance of the scores, policy-level metrics, NaN propagation, the stage
diagnosis), then its ``observations.<graph>`` check is folded into the recording's. Counts add up, extremes are the
extremes of all chunks, means are weighted by the rows compared; a verdict that depends on a rate (the share of
flipped actions) is taken again on the merged counts, so a short last chunk never fails on its own. Two statistics
cannot be merged exactly from per-chunk summaries and are the largest chunk value instead: the 99th percentiles
(``p99_abs``, ``p99_rel``) and the cosine (the smallest, the worst chunk's). A failing check carries the diagnosis
of the failing chunk with the largest error on the decision output, and the rows it names are step indices of the
recording.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from inference.bundle.contract import PolicyContract
from inference.compare.checks import Check
from inference.compare.judge.stats import ArrayComparison, Preset
from inference.compare.runtime_check import outputs_verdict

SUM = {"flips", "count", "explained", "mismatches", "nan_mismatches"}
MEAN = {
    "mean",
    "mean_abs",
    "mean_rel",
    "within_1e3",
    "within_1e2",
    "action_agreement",
    "atol_median",
    "is_mean",
    "k3_kl",
    "mean_exp_abs",
}  # the sampled actions' mismatch (policy_level.mismatch): means over rows
MIN = {"cosine", "min_margin_overall", "ess"}  # ESS: the worst chunk's (not mergeable from per-chunk summaries)
ROWS = {"rows", "flip_rows"}  # row indices: mapped to the recording's steps before merging
LISTS = {"margins", "flip_margins"}
KEEP = 20  # rows and margins listed, as verify lists them


def combine(a: Any, b: Any, wa: float, wb: float, key: str = "") -> Any:
    """Two chunks' values of one metric, by the metric's kind (see the module docstring); ``wa``/``wb`` weigh means."""
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: combine(a.get(k), b.get(k), wa, wb, k) for k in {**a, **b}}
    if key in ("ok", "passed"):
        return bool(a) and bool(b)
    if key in SUM:
        return a + b
    if key in ROWS or key in LISTS:
        return (list(a) + list(b))[:KEEP]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):  # per head
        return [combine(x, y, wa, wb) for x, y in zip(a, b, strict=True)]
    if isinstance(a, bool | str) or not isinstance(a, int | float):
        return a
    if key in MIN or key.startswith("min"):
        return min(a, b)
    if key in MEAN:
        return (a * wa + b * wb) / (wa + wb) if wa + wb else a
    if key.startswith(("max", "p99", "required")) or key == "atol":
        return max(a, b)
    return a


def map_rows(metrics: Any, steps: np.ndarray) -> Any:
    """``metrics`` with every row list (indices into the rows compared) turned into the recording's step indices."""
    if isinstance(metrics, dict):
        return {k: ([int(steps[r]) for r in v if 0 <= r < len(steps)] if k in ROWS and isinstance(v, list) else
                    map_rows(v, steps)) for k, v in metrics.items()}  # fmt: skip
    return metrics


class ObservationMerge:
    """The ``observations.<graph>`` check of every chunk, merged (``add`` per chunk, ``check`` at the end)."""

    def __init__(self, graph: str, contract: PolicyContract, preset: Preset) -> None:
        self.graph, self.contract, self.preset = graph, contract, preset
        self.name = f"observations.{graph}"
        self.rows = 0  # finite observation rows compared
        self.chunks = 0
        self.outputs: dict[str, dict[str, Any]] = {}
        self.metrics: dict[str, Any] = {}
        self.failed_chunks: list[str] = []
        self.worst: tuple[float, dict[str, str] | None, str] = (-1.0, None, "")
        self.nan_rows = 0
        self.nan_differ: set[str] = set()

    def add(self, check: Check, compared_steps: np.ndarray, chunk: str, nan_facts: Mapping[str, Any]) -> None:
        """One chunk's check; ``compared_steps``: the recording's step index of each row the check compared."""
        rows = len(compared_steps)
        metrics = map_rows(check.metrics, compared_steps)
        outputs = metrics.pop("outputs", {})
        for name, cmp in outputs.items():
            have = self.outputs.get(name)
            if have is None:
                self.outputs[name] = dict(cmp)
                continue
            first = have["first_mismatch"]
            if first is None and cmp.get("first_mismatch") is not None:
                first = have["count"] + cmp["first_mismatch"]
            merged = combine(have, cmp, have["count"], cmp["count"])
            merged["first_mismatch"] = first
            self.outputs[name] = merged
        self.metrics = combine(self.metrics or None, metrics, self.rows, rows) or {}
        self.rows += rows
        self.chunks += 1
        self.nan_rows += int(nan_facts.get("rows", 0))
        self.nan_differ |= set(nan_facts.get("outputs_differing", []))
        if check.status == "fail":
            self.failed_chunks.append(chunk)
            decision = outputs.get(self.contract.action.distribution_output, {})
            error = float(decision.get("max_abs", 0.0))
            if error > self.worst[0]:
                self.worst = (error, check.diagnosis, chunk)

    def check(self, runtime: str) -> Check:
        """The recording's check: the verdict taken again on the merged counts, worded as verify words it."""
        metrics = dict(self.metrics)
        flips = metrics.get("flips")
        if flips:
            flips["rate"] = flips["flips"] / max(1, flips["count"])
            flips["ok"] = not flips["flips"] or (flips["explained"] == flips["flips"]
                                                 and flips["rate"] <= self.preset.max_flip_rate)  # fmt: skip
        _flip_rates(metrics.get("argmax"), self.rows)
        cmps = {k: ArrayComparison(**v) for k, v in self.outputs.items()}
        if not cmps:
            return Check(runtime, self.name, "error", "no recorded step could be compared")
        where = f"in {self.chunks} chunk(s)"
        parts, summary = outputs_verdict(cmps, flips, self.contract.action.action,
                                         f"{self.rows} recorded observations ({where})")  # fmt: skip
        diagnosis = None
        if parts:
            summary += f" ({where}; {len(self.failed_chunks)} failing, the worst {self.worst[2]})"
            diagnosis = dict(self.worst[1]) if self.worst[1] else None
        metrics["outputs"] = {k: c.to_dict() for k, c in cmps.items()}
        metrics["chunks"] = {"compared": self.chunks, "failing": self.failed_chunks[:KEEP]}
        return Check(runtime, self.name, "fail" if parts else "pass", summary, metrics, diagnosis)

    def nan_facts(self) -> dict[str, Any]:
        return {"rows": self.nan_rows, "outputs_differing": sorted(self.nan_differ)}


def _flip_rates(argmax: dict[str, Any] | None, rows: int) -> None:
    if not argmax:
        return
    if "flip_rate" in argmax:
        argmax["flip_rate"] = argmax["flips"] / max(1, rows)
    for head in (argmax.get("heads") or {}).values():
        _flip_rates(head, rows)
