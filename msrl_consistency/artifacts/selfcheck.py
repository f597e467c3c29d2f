"""The export self-check: every written graph, in every runtime that can run it here, against its Cell.

Export calls this on the finished bundle before renaming it into place. A format that fails (it does not run in
its runtime, or its outputs are not the Cell's) is reported with the graph, the format, the runtime and why, so
the bundle writer can mark exactly that file as failed and keep the others.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msrl_consistency.runtimes  # noqa: F401 - registers the MindSpore runtimes with inference.runtimes
from inference.bundle import Bundle
from inference.compare.feeds import seeded_feeds
from inference.compare.stats import compare_arrays, tolerance_for
from inference.errors import first_line
from inference.runtimes.base import RuntimeSource
from inference.runtimes.registry import create

SELF_CHECK_RUNTIMES = {"mindir": "ms-mindir", "onnx": "onnxruntime", "ms": "lite"}


def self_check(bundle: Bundle, cells: Mapping[str, Any], samples: int, seed: int) -> dict[str, Any]:
    """Run every written graph on ``samples`` seeded observations against the Cell (graph mode) it came from.

    ``failures`` lists ``{"graph", "format", "runtime", "reason"}``, one per failing file (its first problem).
    """
    feeds = seeded_feeds(bundle, samples, seed)
    source = RuntimeSource(bundle, cells.__getitem__)
    results: list[dict[str, Any]] = []
    failures: list[dict[str, str]] = []
    lite_version = None
    for graph in bundle.graphs:
        inputs = feeds.graph_inputs(bundle, graph)
        with create("ms-graph", source, graph) as cell:
            expected = cell.infer(*inputs)
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
            worst = 0.0
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
            if problem is not None:
                failures.append({"graph": graph, "format": fmt, "runtime": runtime.name, "reason": problem})
            results.append({"graph": graph, "format": fmt, "runtime": runtime.name, "max_abs": worst,
                             "tolerance": tol.to_dict(), "passed": problem is None})  # fmt: skip
    return {
        "passed": not failures,
        "samples": samples,
        "seed": seed,
        "tolerance": bundle.precision,
        "results": results,
        "failures": failures,
        "lite_version": lite_version,
        "reference": "ms-graph",
    }
