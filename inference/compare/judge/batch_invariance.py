"""Batch invariance: does a row get the same bits alone as inside a batch, whatever else is in the batch?

vLLM's and SGLang's batch-invariant modes, and NeMo RL's tests at batch sizes 1/8/32, ask this of inference
engines: a GEMM that tiles or reduces differently by batch size gives a row other last bits at another batch size,
which the element-wise tolerance forgives but which makes a deployed policy's answer depend on its neighbours.
Here, per runtime (and so per precision it computes in): ``ROWS`` ordinary observations run alone (batch 1), then
each at the first, middle and last position inside batches of 8, 64 and 256 filled with other observations. Per
batch size: the share of outputs bitwise equal to the row alone, the largest ULP distance of a float output, and
the action flips. A fact for the report (``info["batch_invariance"]``), not a gate: the repeatability check judges
batch dependence within tolerance.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from inference.compare.judge.stats import ulp_distance

SIZES = (8, 64, 256)
ROWS = 8


def batch_invariance(bundle: Any, runtimes: Mapping[str, Any], feeds: Any, rows: int = ROWS) -> dict[str, Any]:
    """The matrix for the runtime's deciding graph (see the module docstring); ``{}`` with too few rows, or for a
    runtime that answers only the batches it recorded (an audit's device)."""
    from inference.errors import MsrlError

    try:
        return _matrix(bundle, runtimes, feeds, rows)
    except MsrlError:
        return {}


def _matrix(bundle: Any, runtimes: Mapping[str, Any], feeds: Any, rows: int) -> dict[str, Any]:
    graph = bundle.mode_graph("deterministic") or bundle.graphs[0]
    if graph not in runtimes:
        return {}
    runtime = runtimes[graph]
    ordinary = np.flatnonzero(feeds.finite & feeds.ordinary)
    if len(ordinary) < max(SIZES) + rows:
        return {}
    inputs = feeds.graph_inputs(bundle, graph)
    probe, fill = ordinary[:rows], ordinary[rows : rows + max(SIZES)]
    contract = bundle.contract(graph)
    alone = [runtime.infer(*(x[k : k + 1] for x in inputs)) for k in probe]
    out: dict[str, Any] = {"graph": graph, "rows": int(rows), "positions": "first, middle, last",
                           "discrete": bool(contract.action.is_discrete)}  # fmt: skip
    for size in SIZES:
        equal = total = flips = 0
        worst = 0
        for k, row in enumerate(probe):
            for at in (0, size // 2, size - 1):
                batch_rows = np.concatenate([fill[:at], [row], fill[at : size - 1]])
                got = runtime.infer(*(x[batch_rows] for x in inputs))
                for name, want in alone[k].items():
                    have = np.asarray(got[name])[at : at + 1]
                    want = np.asarray(want)
                    if have.shape != want.shape:
                        continue
                    total += 1
                    equal += int(np.array_equal(have, want, equal_nan=True))
                    if want.dtype.kind == "f":
                        worst = max(worst, ulp_distance(want, have))
                a = np.asarray(contract.env_action({n: np.asarray(v)[at : at + 1] for n, v in got.items()}))
                flips += int(not np.array_equal(a, np.asarray(contract.env_action(alone[k]))))
        out[str(size)] = {"bitwise_equal_share": equal / max(1, total), "max_ulp": int(worst),
                          "action_flips": flips, "cases": rows * 3}  # fmt: skip
    return out


def describe(matrix: Mapping[str, Any]) -> str:
    """One line: per batch size the bitwise-equal share, the largest ULP distance and the env actions that changed
    (a discrete action's flips; a continuous action's values not bitwise equal)."""
    if not matrix:
        return "not measured (too few ordinary observations)"
    changed = "flip(s)" if matrix.get("discrete", True) else "env action(s) not bitwise equal"
    parts = [f"batch {s}: {matrix[str(s)]['bitwise_equal_share']:.0%} bitwise equal, max {matrix[str(s)]['max_ulp']} "
             f"ULP, {matrix[str(s)]['action_flips']} {changed}" for s in SIZES if str(s) in matrix]  # fmt: skip
    return "; ".join(parts)
