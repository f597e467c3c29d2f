"""Baselines: stored metrics with per-metric margins (MindSpeed-RL style), checked on every verify.

File format: ``{"schema": "msrl-consistency/baseline", "metrics": {"<runtime>/<check>/<output>.max_abs":
{"value": v, "margin_abs": a, "margin_rel": r}}}``; a metric regresses when it exceeds
``value + max(margin_abs, margin_rel * |value|)``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from inference.bundle.files import read_document, write_json_atomic
from inference.compare.checks import Check, VerifyResult
from inference.errors import UsageError

BASELINE_SCHEMA = "msrl-consistency/baseline"
TRACKED = ("max_abs", "p99_abs", "mismatches")


def collect_metrics(result: VerifyResult) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for c in result.checks:
        for output, stats in c.metrics.get("outputs", {}).items():
            for key in TRACKED:
                metrics[f"{c.runtime}/{c.name}/{output}.{key}"] = float(stats[key])
        for key in ("differing_actions", "episodes_diverged"):
            if key in c.metrics:
                metrics[f"{c.runtime}/{c.name}.{key}"] = float(c.metrics[key])
    return metrics


def save_baseline(path: Path, result: VerifyResult, margin_abs: float = 1e-6, margin_rel: float = 0.5) -> None:
    metrics = {
        k: {"value": v, "margin_abs": margin_abs, "margin_rel": margin_rel}
        for k, v in collect_metrics(result).items()
        if not math.isnan(v)  # nothing exceeds NaN: such a metric would track nothing (and baselines refuse NaN)
    }
    write_json_atomic(path, {"schema": BASELINE_SCHEMA, "metrics": metrics})


def read_baseline(path: Path) -> dict[str, Any]:
    """A baseline file, checked (``UsageError`` naming the file and the metric): verify reads it before it compares
    anything, so a bad file costs no run."""
    data: dict[str, Any] = read_document(path, "baseline", UsageError)
    if not isinstance(data, dict) or data.get("schema") != BASELINE_SCHEMA:
        schema = data.get("schema") if isinstance(data, dict) else None
        raise UsageError(f"{path} is not a baseline file (schema {schema!r})")
    _check_metrics(path, data.get("metrics"))
    return data


def check_baseline(path: Path, result: VerifyResult, data: dict[str, Any] | None = None) -> Check:
    """``result``'s metrics against the baseline at ``path`` (``data``: the file as ``read_baseline`` read it)."""
    data = read_baseline(path) if data is None else data
    current = collect_metrics(result)
    regressions = []
    for key, spec in data["metrics"].items():
        if key not in current:
            continue
        limit = spec["value"] + max(spec.get("margin_abs", 0.0), spec.get("margin_rel", 0.0) * abs(spec["value"]))
        if current[key] > limit:
            regressions.append(f"{key} {current[key]:.3g} > {limit:.3g}")
    compared = len(set(data["metrics"]) & set(current))
    summary = (
        f"{len(regressions)} of {compared} metrics regressed: " + "; ".join(regressions[:5])
        if regressions else f"{compared} metrics within their baseline margins"
    )  # fmt: skip
    return Check("baseline", "baseline", "fail" if regressions else "pass", summary, {"regressions": regressions})


def _check_metrics(path: Path, metrics: Any) -> None:
    """Every stored metric is ``{"value": number, "margin_abs": >= 0, "margin_rel": >= 0}``, or one line says which
    is not."""
    if not isinstance(metrics, dict):
        raise UsageError(f"baseline {path}: metrics must be an object of metric name -> {{value, margins}}")
    number = lambda v: isinstance(v, int | float) and not isinstance(v, bool)  # noqa: E731
    for key, spec in metrics.items():
        if not isinstance(spec, dict) or not number(spec.get("value")):
            raise UsageError(f"baseline {path}: metric {key!r} has no number value")
        for margin in ("margin_abs", "margin_rel"):
            value = spec.get(margin, 0.0)
            if not number(value) or not 0 <= value < math.inf:
                raise UsageError(f"baseline {path}: metric {key!r}: {margin} must be a finite number >= 0, got {value}")
