"""Localise the first stage at which a runtime departs from the training path.

Runtimes expose only graph outputs, so each stage is tested as a hypothesis against evidence from the
reference Cell: preprocessing (does the runtime match the policy *without* its normalisation, or the policy on
observations scaled by 255 or 1/255?), network (actor and critic outputs), post-processing (same logits/mean,
different action; an action that equals the raw mean or the unsquashed sample), sampling (deterministic outputs
agree, sampled actions do not under the same noise), precision (a half-precision export), training mode (a graph
with BatchNorm/Dropout that is not repeatable or depends on its batch), batch coupling (a row that depends on
the other rows of its batch without them) and provenance (another checkpoint). A rule names a stage only
when its evidence says so; the network rule never claims weights differ when the bundle says it was exported
from this very checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from inference.bundle import Bundle
    from inference.compare.checks import Check
    from inference.compare.judge.localize import Localization


@dataclass
class Diagnosis:
    # provenance | preprocessing | network | postprocessing | sampling | state | precision | training-mode |
    # batch-coupled | version | runtime | unknown
    stage: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"stage": self.stage, "detail": self.detail}


@dataclass
class Evidence:
    """What one failing runtime's outputs say, gathered by ``runtime_check``; every field is about the graph that
    decides the action (the deterministic one, else the only one) unless named otherwise."""

    param_ok: bool  # the decision output (logits, Q-values, mean, or the action itself) within tolerance
    action_ok: bool  # the deterministic env action agrees (True when every graph samples)
    sample_ok: bool  # sampled actions agree under identical noise (True when nothing samples)
    value_ok: bool
    max_rel_param: float
    cosine_param: float
    precision: str  # the bundle's
    checkpoint_matches: bool | None
    without_norm_matches: bool = False  # the runtime equals the policy without its observation normalisation
    input_scale: float | None = None  # the runtime equals the policy on observations x this factor
    raw_mean_action: bool = False  # actions equal the raw mean: scaling to the bounds is missing
    unsquashed_sample: bool = False  # in-graph samples equal mean + std * noise: the squash is missing
    separate_sampling_graph: bool = False  # the sampled action comes from a graph of its own
    state_ok: bool = True  # the carried states' ``next`` outputs agree
    others_failed: tuple[str, ...] = ()  # outputs with no role in the contract (features, Q-values) that differ


def close(a: np.ndarray, b: np.ndarray, atol: float, rtol: float) -> bool:
    """Equal within tolerance where both are finite (the hypotheses' "equals")."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return False
    mask = np.isfinite(a) & np.isfinite(b)
    return bool(mask.any() and np.allclose(a[mask], b[mask], atol=atol, rtol=rtol))


def diagnose(e: Evidence) -> Diagnosis:
    """Rules ordered from the most specific explanation to the most general."""
    if e.checkpoint_matches is False:
        return Diagnosis("provenance", "the bundle was exported from a different checkpoint (sha256 differs)")
    half = e.precision == "fp16"
    if not e.param_ok:
        if e.without_norm_matches:
            return Diagnosis("preprocessing", "outputs match the policy without observation normalisation: the graph "
                             "does not normalise observations")  # fmt: skip
        if e.input_scale is not None:
            factor = "x255" if e.input_scale > 1 else "/255"
            missing = "lacks the Cell's /255 input scaling" if e.input_scale > 1 else "scales its input by 1/255 twice"
            return Diagnosis("preprocessing", f"outputs equal the Cell's on observations {factor}: the graph {missing}")
        if half:
            return Diagnosis("precision", f"an fp16 export: max relative difference {e.max_rel_param:.1e}, cosine "
                             f"{e.cosine_param:.6f}; use the fp16 tolerance preset or export fp32")  # fmt: skip
        which = "actor" if e.value_ok else "actor and critic"
        tested = ("the outputs are neither the policy's without its observation normalisation nor on inputs scaled "
                  "x255 or /255")  # fmt: skip
        if e.checkpoint_matches:
            return Diagnosis("network", f"{which} outputs differ although the bundle was exported from this "
                             f"checkpoint; {tested}: the graph computes something other than the Cell (a changed "
                             "layer or constant, preprocessing inside the Cell, another architecture)")  # fmt: skip
        return Diagnosis("network", f"{which} outputs differ; {tested}: weights, constants or layers differ")
    if not e.action_ok:
        if e.raw_mean_action:
            return Diagnosis("postprocessing", "actions equal the raw mean: scaling to the action bounds is missing")
        if half:
            return Diagnosis("precision", "an fp16 export: the logits/mean agree within the fp16 tolerance, the "
                             "actions differ where the outputs' fp16 error moves them")  # fmt: skip
        return Diagnosis("postprocessing", "same logits/mean but different actions: action post-processing differs")
    if not e.sample_ok:
        if e.unsquashed_sample:
            return Diagnosis("postprocessing", "sampled actions equal the unsquashed sample mean + std x noise: the "
                             "squash to the action bounds is missing from the sampling graph")  # fmt: skip
        if half:
            return Diagnosis(
                "precision",
                "an fp16 export: deterministic outputs agree, sampled actions differ "
                "where fp16 error moves a sample (near-ties, or noise transformed in half precision)",
            )
        where = "the sampling graph's outputs differ" if e.separate_sampling_graph else "sampled actions differ"
        return Diagnosis("sampling", f"deterministic outputs agree but {where} under identical noise: the noise "
                         "stream or its transformation differs")  # fmt: skip
    if not e.value_ok:
        return Diagnosis("network", "the actor's outputs agree but the value output differs: the critic's weights or "
                         "layers differ from the Cell's")  # fmt: skip
    if not e.state_ok:
        return Diagnosis("state", "the decision outputs agree but the carried state's next output does not: the graph "
                         "does not return the state the Cell carries (next names another output, or the state is not "
                         "updated), so it drifts step after step")  # fmt: skip
    if e.others_failed:
        return Diagnosis("network", f"the decision outputs agree, the outputs {', '.join(e.others_failed)} do not: "
                         "weights, constants or layers behind them differ from the Cell's")  # fmt: skip
    return Diagnosis("unknown", "no single stage explains the difference")


TRAINING_MODE_OPS = (b"Dropout", b"BatchNorm")


def training_mode_ops(graph_file: bytes) -> list[str]:
    """Ops in a serialised graph (MindIR or ONNX protobuf: op types are plain strings) that behave differently in
    training mode; empty for formats that do not name ops as strings (``.ms``)."""
    return [op.decode() for op in TRAINING_MODE_OPS if op in graph_file]


def not_repeatable(ops: list[str], batch_dependent: bool, what: str, cell_couples: bool | None = None) -> Diagnosis:
    """A runtime whose graph gives other outputs for the same input, or for the same row among other rows.

    A row that depends on the other rows of its batch is training mode only where the graph has BatchNorm or
    Dropout and the Cell (in eval mode) does not couple rows itself; otherwise the network couples rows (a reduction
    over the batch axis). ``cell_couples``: whether the reference Cell's rows depend on each other the same way
    (None: not measured)."""
    if batch_dependent and (cell_couples or not ops):
        symptom = "outputs of a row depend on the other rows of its batch"
        training = f" ({', '.join(ops)} in the graph is not the cause: the Cell in eval mode does the same)" * bool(ops)
        if cell_couples:
            return Diagnosis("batch-coupled", f"{symptom}, in the Cell as in {what}{training}: the network couples "
                             "its rows (a reduction over the batch axis, e.g. a mean or max with no axis or over axis "
                             "0), so one observation's action depends on what else is in its batch; reduce over the "
                             "feature axes only")  # fmt: skip
        where = "; the Cell's own rows were not tested" if cell_couples is None else ", while the Cell's do not"
        return Diagnosis("batch-coupled", f"{symptom} and {what} has no BatchNorm or Dropout{where}: the graph couples "
                         "its rows (a reduction over the batch axis, e.g. a mean or max with no axis, or a shape "
                         "frozen at export)")  # fmt: skip
    symptom = "outputs of a row depend on the other rows of its batch" if batch_dependent else (
        "the same input gives different outputs"
    )  # fmt: skip
    if ops:
        return Diagnosis("training-mode", f"{symptom} and the graph contains {', '.join(ops)}: {what} was exported "
                         "while the Cell was in training mode (call set_train(False) before export, in a process that "
                         "never compiled it in training mode); the reference was put in eval mode")  # fmt: skip
    return Diagnosis("sampling", f"{symptom}: sampling inside the graph cannot be reproduced by another runtime; "
                     "take the noise as an input")  # fmt: skip


def name_lowered_precision(
    bundle: Bundle, runtimes: Mapping[str, Mapping], checks: list[Check], localizations: Mapping[str, Localization]
) -> None:
    """A failure that only the runtimes computing this float32 bundle in a lowered precision (fp16, int8) have, while
    every float32 runtime compared agrees with the Cell, is that precision's: stage ``precision``, naming the first
    diverging layer where one was localised, instead of the outputs' own guess (a changed layer)."""
    if bundle.precision != "fp32":
        return
    lowered = {n for n, info in runtimes.items() if (info.get("precision") or {}).get("judged_as") in ("fp16", "int8")}
    full = {n for n, info in runtimes.items() if info.get("status") == "ran" and n not in lowered}
    if not lowered or not full or any(c.status == "fail" and c.runtime in full for c in checks):
        return
    for c in checks:
        if c.runtime in lowered and c.status == "fail" and (c.diagnosis or {}).get("stage") in ("network", None):
            precision = runtimes[c.runtime]["precision"]["judged_as"]
            found = localizations.get(c.runtime)
            layer = f"; first diverging layer: {found.first} ({found.first_kind})" if found and found.first else ""
            c.diagnosis = {"stage": "precision", "detail": f"only the {precision} runtime differs (every float32 "
                           f"runtime agrees with the Cell): {precision} overflows, saturates or rounds away what "
                           f"a layer computes{layer}; keep that layer in fp32 (a precision plan, --lower "
                           f"{precision})"}  # fmt: skip
