"""The export self-check: every written graph, in every runtime that can run it here, against its Cell.

Export calls this on the finished bundle before renaming it into place. A format that fails (it does not run in
its runtime, or its outputs are not the Cell's) is reported with the graph, the format, the runtime and why, so
the bundle writer can mark exactly that file as failed and keep the others. A graph whose outputs differ is
localised on the rows that differ most (the ``localize`` the caller hands in, ``localization.localize`` from the
API; artifacts never import localisation, which builds on them): the reason names the first diverging layer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

import msrl_consistency.runtimes  # noqa: F401 - registers the MindSpore runtimes with inference.runtimes
from inference.bundle import Bundle
from inference.compare.feeds import seeded_feeds
from inference.compare.judge.stats import Tolerance, compare_arrays, tolerance_for
from inference.errors import first_line
from inference.runtimes.base import RuntimeSource
from inference.runtimes.registry import REFERENCE, create

SELF_CHECK_RUNTIMES = {"mindir": "ms-mindir", "onnx": "onnxruntime", "ms": "lite"}


Localize = Callable[..., Any]  # (cell, runtime, inputs, bundle, graph, tol) -> a localisation with ``line()``


def self_check(
    bundle: Bundle, cells: Mapping[str, Any], samples: int, seed: int, localize: Localize | None = None
) -> dict[str, Any]:
    """Run every written graph on ``samples`` seeded observations against the Cell it came from, run as verify's
    reference runs it (``ms-cell``, PyNative): the self-check holds each file to what verify will hold it to, and
    compiles no graph of the Cell (~0.25 s per graph for a small policy).

    ``failures`` lists ``{"graph", "format", "runtime", "reason"}``, one per failing file (its first problem).
    """
    feeds = seeded_feeds(bundle, samples, seed)
    source = RuntimeSource(bundle, cells.__getitem__)
    results: list[dict[str, Any]] = []
    failures: list[dict[str, str]] = []
    lite_version = None
    cell_outputs: dict[str, dict[str, np.ndarray]] = {}
    for graph in bundle.graphs:
        inputs = feeds.graph_inputs(bundle, graph)
        with create(REFERENCE, source, graph) as cell:
            expected = cell_outputs[graph] = cell.infer(*inputs)
        for fmt, entry in bundle.graph(graph)["files"].items():
            if "file" not in entry:
                continue
            runtime = create(SELF_CHECK_RUNTIMES[fmt], source, graph)
            reason = runtime.unavailable_reason(source)
            if reason:
                results.append({"graph": graph, "format": fmt, "skipped": reason})
                continue
            tol = tolerance_for(bundle.precision, runtime.name)
            problem = None
            try:
                with runtime:
                    got = runtime.infer(*inputs)
                    lite_version = runtime.versions().get("mindspore_lite", lite_version)
            except Exception as exc:  # noqa: BLE001 - any runtime failure means the written graph is unusable
                problem = f"does not run in {runtime.name}: {first_line(exc, 300)}"
                got = {}
            worst, diverging = 0.0, False
            for name, ref in expected.items() if problem is None else ():
                cmp = compare_arrays(name, ref, got[name], tol, feeds.ordinary)
                worst = max(worst, cmp.max_abs)
                if problem is not None or cmp.passed:
                    continue
                if cmp.shape_mismatch:
                    problem = f"output {name} has shape {cmp.shape_mismatch} in {runtime.name} at batch {samples}"
                else:
                    problem = (f"output {name} differs from the Cell in {runtime.name}: {cmp.mismatches}/{cmp.count} "
                               f"elements off (max abs {cmp.max_abs:.3g})")  # fmt: skip
                    diverging = True
            if diverging:
                problem += _localized(localize, bundle, graph, cells[graph], runtime.name, inputs, expected, got, tol)
            if problem is not None:
                failures.append({"graph": graph, "format": fmt, "runtime": runtime.name, "reason": problem})
            results.append({"graph": graph, "format": fmt, "runtime": runtime.name, "max_abs": worst,
                             "tolerance": tol.to_dict(), "passed": problem is None})  # fmt: skip
    out = {
        "passed": not failures,
        "samples": samples,
        "seed": seed,
        "tolerance": bundle.precision,
        "results": results,
        "failures": failures,
        "lite_version": lite_version,
        "reference": REFERENCE,
    }
    if bundle.precision == "fp32" and bundle.target.get("computes_in") == "fp16":
        out["fp16_emulation"] = fp16_emulation(bundle, cells, feeds, cell_outputs, localize)
    return out


def fp16_emulation(
    bundle: Bundle, cells: Mapping[str, Any], feeds: Any, cell_outputs: Mapping[str, Mapping[str, np.ndarray]],
    localize: Localize | None,
) -> dict[str, Any]:  # fmt: skip
    """The graphs as the target's fp16 computes them (``emulated-fp16``) against the Cell's outputs on the same feeds,
    with the fp16 preset: a float32 bundle exported for a device that computes in fp16 is told before deploying
    whether fp16 breaks it, and which layer (not a failure of any file: the files are right, the device's precision is
    not)."""
    source = RuntimeSource(bundle, cells.__getitem__)
    tol = tolerance_for("fp16", "emulated-fp16")
    for graph in bundle.graphs:
        runtime = create("emulated-fp16", source, graph)
        reason = runtime.unavailable_reason(source) or (None if bundle.has_file(graph, "onnx") else
                                                        "the bundle has no .onnx graph to emulate")  # fmt: skip
        if reason:
            return {"passed": None, "reason": f"not emulated: {reason}"}
        inputs, expected = feeds.graph_inputs(bundle, graph), cell_outputs[graph]
        with runtime:
            got = runtime.infer(*inputs)
        for name, ref in expected.items():
            cmp = compare_arrays(name, ref, got[name], tol, feeds.ordinary)
            if cmp.passed:
                continue
            where = _localized(localize, bundle, graph, cells[graph], runtime.name, inputs, expected, got, tol)
            return {"passed": False, "graph": graph,
                    "reason": f"in fp16 (emulated), output {name} of {graph} differs from the Cell: {cmp.mismatches}/"
                    f"{cmp.count} elements beyond the fp16 tolerance (max abs {cmp.max_abs:.3g}){where}"}  # fmt: skip
    return {"passed": True, "reason": f"in fp16 (emulated) every output agrees with the Cell ({tol.describe()})"}


LOCALIZE_ROWS = 16


def _localized(
    localize: Localize | None, bundle: Bundle, graph: str, cell: Any, runtime: str, inputs: list[np.ndarray],
    expected: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], tol: Tolerance,
) -> str:  # fmt: skip
    """``; first diverging layer: ...`` for ``runtime`` on the rows whose outputs differ most (or why it is not
    localised); never raises, the self-check's verdict stands either way."""
    if localize is None:
        return ""
    error = np.zeros(len(inputs[0]))
    for name, ref in expected.items():
        if name in got and np.shape(got[name]) == np.shape(ref) and np.ndim(ref) and len(ref) == len(error):
            with np.errstate(all="ignore"):
                diff = np.abs(np.asarray(ref, np.float64) - np.asarray(got[name], np.float64)).reshape(len(ref), -1)
            error = np.maximum(error, np.nan_to_num(diff, nan=np.inf).max(1))
    rows = np.sort(np.argsort(-error, kind="stable")[:LOCALIZE_ROWS])
    try:
        loc = localize(cell, runtime, [x[rows] for x in inputs], bundle, graph, tol)
    except Exception as exc:  # noqa: BLE001 - localisation is evidence for the reason, never a new failure
        return f"; not localized: {first_line(exc, 160)}"
    return "; " + loc.line().removeprefix(f"{runtime}: ")
