"""The reference verify judges against, built from the training path's Cells: played by their compiled twin where it
gives PyNative's bits (or, for a run trained in lowered numerics, PyNative's actions within a few ULP), and, for such a
run, the Cell computing in the numerics it was trained in, against which the lowered runtime is judged."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from inference.bundle import Bundle
from inference.compare.batches import infer_feeds
from inference.compare.feeds import seeded_feeds
from inference.compare.inputs import Inputs
from inference.compare.judge.device_precision import (
    runtime_precision,
)
from inference.compare.judge.stats import ulp_distance
from inference.compare.options import VerifyOptions
from inference.compare.reference import REFERENCE, Reference, build_reference
from inference.errors import UsageError
from inference.runtimes.base import Runtime, RuntimeSource
from inference.runtimes.registry import RUNTIMES, create


class TrainedReference:
    """A bundle of a run trained in the device's numerics (its plan's ``trained``): the runtime that computes the
    plan's lowered precision is judged against the run's own Cell computing in those numerics (the training path,
    ``cells.lowered``), built once when first needed; every other runtime against the float reference."""

    def __init__(self, bundle: Bundle, source: RuntimeSource, inputs: Inputs, options: VerifyOptions,
                 progress: Callable[[str], None]) -> None:  # fmt: skip
        plan = bundle.plan or {}
        self.lower = plan.get("lower") if plan.get("trained") else None
        self.bundle, self.source, self.inputs, self.options, self.progress = bundle, source, inputs, options, progress
        self.built: Reference | None = None

    def reference_for(self, name: str) -> Reference | None:
        if self.lower is None or runtime_precision(self.bundle, name, self.options.device).preset != self.lower:
            return None
        if self.built is None:
            cells = getattr(self.source.cells, "lowered", None)
            if cells is None:
                raise UsageError(f"{self.bundle.root} was trained in {self.lower}: its lowered runtime is judged "
                                 "against the run's own Cell in those numerics; pass --ckpt RUN")  # fmt: skip
            self.progress(f"reference {REFERENCE} in {self.lower} (the training path), for {name}")
            lowered = RuntimeSource(self.bundle, cells, self.options.device, self.options.device_id)
            # Its compiled twin may differ from PyNative in the last bits of a float layer kept in fp32 (a batch's tail
            # rows): the training rollouts ran that compiled graph, and PyNative would play every episode op by op.
            self.built = reference_for(self.bundle, lowered, self.inputs, self.options, twin_ulps=TRAINED_TWIN_ULPS)
        return self.built

    def describe(self) -> str:
        return f"{REFERENCE} in {self.lower}: the run's Cell computing in the numerics it was trained in"


def reference_for(bundle: Bundle, source: RuntimeSource, inputs: Inputs, options: VerifyOptions,
                  twin_ulps: int = 0) -> Reference:  # fmt: skip
    """The reference verify builds for ``bundle`` with ``options`` (the training path's Cells on ``inputs``);
    ``twin_ulps``: how far its compiled twin may be from PyNative to play the episodes (``_compiled_twin``)."""
    return build_with_twin(bundle, source, inputs, options, keep_twin=False, twin_ulps=twin_ulps)[0]


def build_with_twin(
    bundle: Bundle, source: RuntimeSource, inputs: Inputs, options: VerifyOptions, keep_twin: bool, twin_ulps: int = 0
) -> tuple[Reference, dict[str, Runtime] | None]:
    """The reference, and its compiled twin left open when ``keep_twin`` (it is then the ``ms-graph`` runtime)."""
    ref = {g: create(REFERENCE, source, g).open() for g in bundle.graphs}
    evidence: dict[str, Runtime] = {}
    det = bundle.mode_graph("deterministic")
    without = getattr(source.cells, "without_normalization", None)
    compiled, why = _compiled_twin(bundle, source, ref, options.seed, twin_ulps)
    kept = False
    try:
        if det is not None and without is not None:
            cell = without(det)
            if cell is not None:
                evidence[det] = create(REFERENCE, RuntimeSource(bundle, lambda _g: cell), det).open()
        reference = build_reference(
            bundle, ref, inputs, options.observations, options.episodes, options.seed, evidence, compiled
        )
        reference.episodes_by = why
        kept = keep_twin and compiled is not None
        return reference, compiled if kept else None
    finally:
        for rt in (*ref.values(), *evidence.values(), *((compiled or {}).values() if not kept else ())):
            rt.close()


TWIN = "ms-graph"  # the runtime the compiled twin is


TWIN_PROBE = 256


TRAINED_TWIN_ULPS = 4  # a trained lowered Cell's twin: its kept float layers may round their tail rows differently


def _compiled_twin(
    bundle: Bundle, source: RuntimeSource, ref: Mapping[str, Runtime], seed: int, ulps: int = 0
) -> tuple[dict[str, Runtime] | None, str]:
    """The reference Cell compiled (``ms-graph``), if it gives the same bits as PyNative on a seeded probe (or, with
    ``ulps``, the same actions and float outputs within that many ULP).

    PyNative runs op by op (~20 ms a step for a 256-256-128 policy, measured); the compiled Cell runs the same
    kernels in one call (~3 ms). Episodes are sequential, so the reference plays them with the compiled twin
    when the two agree exactly, and stays op by op when they do not.
    """
    if RUNTIMES[TWIN].why_not(source):
        return None, f"{REFERENCE} (ms-graph unavailable)"
    feeds = seeded_feeds(bundle, TWIN_PROBE, seed)
    twin = {g: create(TWIN, source, g).open() for g in bundle.graphs}
    for graph, rt in twin.items():  # in the feeds' chunks: the twin then compiles the batch sizes it plays and feeds
        want, got = infer_feeds(ref[graph], bundle, graph, feeds), infer_feeds(rt, bundle, graph, feeds)
        if not _twins(bundle, graph, want, got, ulps):
            for opened in twin.values():
                opened.close()
            return None, f"{REFERENCE} (the compiled Cell differs from PyNative on graph {graph!r})"
    same = "bitwise equal to" if not ulps else f"the same actions as, and within {ulps} ULP of,"
    return twin, f"ms-graph, {same} {REFERENCE} on {TWIN_PROBE} observations"


def _twins(bundle: Bundle, graph: str, want: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray],
           ulps: int) -> bool:  # fmt: skip
    if all(np.array_equal(want[k], got[k], equal_nan=True) for k in want):
        return True
    if not ulps:
        return False
    contract = bundle.contract(graph)
    if not np.array_equal(np.asarray(contract.env_action(want)), np.asarray(contract.env_action(got))):
        return False
    return all(np.array_equal(want[k], got[k]) if want[k].dtype.kind != "f" else
               ulp_distance(want[k], got[k]) <= ulps for k in want)  # fmt: skip
