"""Where it diverges, after the per-runtime checks: a failing runtime's first diverging layer (the localizer's layer
by layer comparison, on the rows that differ most), and the layer a checkpoint other than the bundle's source changed.
A localisation that cannot run says why; it never changes a verdict."""

from __future__ import annotations

import numpy as np

from inference.bundle import Bundle
from inference.compare.checks import Check
from inference.compare.judge.localize import Localization, Localizer
from inference.compare.judge.stats import Tolerance
from inference.compare.options import LOCALIZE_STAGES
from inference.compare.reference import Reference
from inference.compare.runtime_check import RuntimeReport
from inference.errors import first_line


def wants_localization(mode: str, report: RuntimeReport, bundle: Bundle, name: str) -> bool:
    if mode == "never" or report.info.get("status") != "ran":
        return False
    stages = {c.diagnosis["stage"] for c in report.checks if c.status == "fail" and c.diagnosis}
    lowered = name == "emulated-fp16" or (name == "lite" and bundle.plan is not None)  # where a precision breaks
    failed = any(c.status == "fail" for c in report.checks)
    fp16_lite = bundle.precision == "fp16" and name in ("lite", "lite-aarch64")  # where the fp16 error grows
    return mode == "always" or bool(stages & LOCALIZE_STAGES) or fp16_lite or (lowered and failed)


def localize_failure(
    localizer: Localizer, bundle: Bundle, reference: Reference, report: RuntimeReport, name: str, tol: Tolerance
) -> Localization:
    """The runtime's per-layer comparison, on the graph whose outputs failed (else the deciding graph) and the rows
    where its decision output differs most. A localisation that cannot run says why; it never ends the verdict."""
    failed = [c.name.split(".", 1)[1] for c in report.checks
              if c.name.startswith("observations.") and c.status == "fail"]  # fmt: skip
    graph = failed[0] if failed else bundle.mode_graph("deterministic") or bundle.graphs[0]
    rows = report.worst_rows.get(graph, np.zeros(0, int))
    if not len(rows):
        return Localization(name, None, None, [], "not localized: no ordinary observation row to run on")
    inputs = reference.feeds.graph_inputs(bundle, graph, rows)
    try:
        return localizer(name, graph, rows, inputs, tol)
    except Exception as exc:  # noqa: BLE001 - a layer search that fails is reported, the verdict stands
        return Localization(name, None, None, [], f"not localized: {first_line(exc)}", method="none")


def preprocessing_first(found: Localization, checks: list[Check]) -> None:
    """The first diverging layer is the observation normaliser: the failures the outputs alone called "network" are
    preprocessing (a clip bound, mean or variance the graph holds otherwise than the Cell)."""
    if found.first_role != "preprocessing":
        return
    detail = (
        f"the first diverging layer is {found.first} ({found.first_kind}), the observation normaliser: the graph "
        "normalises or clips observations otherwise than the Cell (a changed clip bound, mean or variance)"
    )
    for c in checks:
        if c.status == "fail" and c.diagnosis and c.diagnosis.get("stage") == "network":
            c.diagnosis = {"stage": "preprocessing", "detail": detail}


CHECKPOINT = "checkpoint"  # the localisation of a checkpoint other than the bundle's source: its differing layer


def checkpoint_difference(
    localizer: Localizer, bundle: Bundle, reference: Reference, checks: list[Check]
) -> Localization | None:
    """The checkpoint given is not the one the bundle was exported from: its Parameters against those the bundle
    carries, layer by layer, so the provenance check names what changed (not only that the hash differs)."""
    compare = getattr(localizer, "checkpoint_difference", None)
    if compare is None:
        return None
    deciding = bundle.mode_graph("deterministic") or bundle.graphs[0]
    rows = np.flatnonzero(reference.feeds.finite & reference.feeds.ordinary)[:8]
    if not len(rows):
        rows = np.arange(min(8, len(reference.feeds)))
    found = None
    for graph in (deciding, *(g for g in bundle.graphs if g != deciding)):  # the first graph whose weights differ
        try:
            here = compare(graph, reference.feeds.graph_inputs(bundle, graph, rows))
        except Exception as exc:  # noqa: BLE001 - a comparison that cannot run is said, the verdict stands
            here = Localization(CHECKPOINT, None, None, [], f"not localized: {first_line(exc)}", method="none")
        found = found or here
        if here is not None and here.first is not None:
            found = here
            break
    if found is None:
        return None
    provenance = next(c for c in checks if c.name == "provenance")
    if found.first is not None:
        head = next(r for r in found.layers if r.scope == found.first)
        provenance.summary += (f"; first differing layer: {found.first} ({found.first_kind}), {head.note}, max abs "
                               f"{head.max_abs:.2e}")  # fmt: skip
    else:
        provenance.summary += f"; its parameters against the bundle's: {found.message}"
    provenance.metrics["first_differing_layer"] = found.first
    return found


def name_the_layer(found: Localization, checks: list[Check]) -> None:
    """A failure diagnosed as provenance names the checkpoint's first differing layer."""
    if found.first is None:
        return
    for c in checks:
        if c.diagnosis and c.diagnosis.get("stage") == "provenance" and found.first not in c.diagnosis["detail"]:
            c.diagnosis = {**c.diagnosis, "detail": f"{c.diagnosis['detail']}; first differing layer: {found.first} "
                           f"({found.first_kind})"}  # fmt: skip
