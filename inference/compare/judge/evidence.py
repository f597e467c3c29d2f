"""The evidence a diagnosis weighs, gathered from one runtime's outputs next to the reference's, and the rules for
when two sets of actions agree. ``diagnose`` decides the stage from it; this module only measures.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from inference.bundle import Bundle
from inference.bundle.contract import PolicyContract
from inference.compare.judge.diagnose import Diagnosis, Evidence, close, diagnose
from inference.compare.judge.stats import ArrayComparison, Tolerance
from inference.compare.reference import Reference


def same_shape(ref: Mapping[str, np.ndarray], got: Mapping[str, np.ndarray], key: str | None) -> bool:
    return key is not None and np.shape(ref[key]) == np.shape(got[key])


def take_rows(array: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The rows of a batched output; an output that ignores the batch (a state-independent std) is kept whole."""
    return array[rows] if array.ndim and array.shape[0] == len(rows) else array


def select_rows(outputs: Mapping[str, np.ndarray], rows: np.ndarray) -> dict[str, np.ndarray]:
    return {k: take_rows(v, rows) for k, v in outputs.items()}


def action_atol(
    bundle: Bundle, mode: str, tolerance: Mapping[str, Tolerance], actions: np.ndarray | None = None
) -> float:
    """The absolute difference two continuous actions may have in ``mode``: the acting output's atol, plus its
    ``scale`` times the largest reference action (actions of real episodes: no synthetic extremes)."""
    graph = bundle.mode_graph(mode)
    action = bundle.contract(graph).action  # type: ignore[arg-type]
    tol = tolerance[action.action or action.distribution_output]
    largest = float(np.abs(actions).max()) if actions is not None and actions.size and tol.scale else 0.0
    return tol.atol + tol.scale * largest


def gather_diagnosis(
    bundle: Bundle, ref: Reference, got: dict[str, dict[str, np.ndarray]], cmps: dict[str, dict[str, ArrayComparison]],
    tolerance: Mapping[str, Tolerance], checkpoint_matches: bool | None,
) -> dict[str, str]:  # fmt: skip
    """A failing runtime's diagnosis: the evidence ``diagnose`` weighs, gathered for any contract kind and whether or
    not the graph takes noise."""
    det = bundle.mode_graph("deterministic")
    if det is not None and bundle.contract(det).takes_noise:
        det = None  # a noise-input graph acting on zero noise: its action output is judged as the sampler's, below
    graph = det or bundle.graphs[0]
    contract = bundle.contract(graph)
    a = contract.action
    decision = a.distribution_output
    finite = ref.feeds.finite
    ref_out, got_out = select_rows(ref.outputs[graph], finite), select_rows(got[graph], finite)
    param = cmps[graph][decision]
    tol = tolerance[decision]
    e = Evidence(
        param_ok=all(cmps[graph][head].passed for head in a.heads), action_ok=True, sample_ok=True,
        value_ok=all(cmps[g][c.value].passed for g in bundle.graphs if (c := bundle.contract(g)).value),
        max_rel_param=param.max_rel, cosine_param=param.cosine, precision=bundle.precision,
        checkpoint_matches=checkpoint_matches,
        state_ok=all(cmps[g][st.next].passed for g in bundle.graphs for st in bundle.contract(g).states),
        others_failed=tuple(sorted({name for g in bundle.graphs for name, c in cmps[g].items()
                                    if not c.passed and name not in _roles(bundle.contract(g))})),
    )  # fmt: skip
    if not same_shape(ref_out, got_out, decision):
        return Diagnosis("network", f"output {decision!r} has shape {param.shape_mismatch}: the graph's shapes are "
                         "not the Cell's (a shape frozen at export)").to_dict()  # fmt: skip
    got_param = got_out[decision]
    # A hypothesis "equals" the runtime within 0.1% of the output's magnitude (or the runtime's own tolerance when
    # looser): a structural cause moves outputs by far more; float rounding of the rebuilt input (x255/255) by less.
    magnitude = float(np.nanmax(np.abs(got_param))) if np.size(got_param) else 0.0
    h_atol, h_rtol = max(tol.atol, 1e-3 * magnitude), max(tol.rtol, 1e-3)
    without = ref.without_norm.get(graph) if ref.without_norm else None
    e.without_norm_matches = without is not None and close(got_param, take_rows(without, finite), h_atol, h_rtol)
    for k, scaled in ref.input_scaled.items():
        if close(got_param, scaled, h_atol, h_rtol):
            e.input_scale = k
            break
    if det is not None:
        ref_action, got_action = contract.env_action(ref_out), contract.env_action(got_out)
        atol = action_atol(bundle, "deterministic", tolerance, np.asarray(ref_action))
        e.action_ok = actions_agree(contract, ref_action, got_action, atol)
        if not a.is_discrete and a.squash != "none":
            e.raw_mean_action = close(got_action, ref_out[a.mean or decision], atol, 0.0)
    sto = bundle.mode_graph("stochastic")
    if sto is not None and sto != graph:
        e.separate_sampling_graph = True
        sc = bundle.contract(sto)
        others = {sc.value, *(st.next for st in sc.states)}  # judged as value_ok and state_ok
        e.sample_ok = all(c.passed for k, c in cmps[sto].items() if k not in others)
    elif sto is not None and sto in ref.feeds.noise:  # (an audit of deterministic steps records no noise)
        noise = ref.feeds.noise[sto][finite]
        atol = tolerance[a.action or decision].atol
        if contract.samples_on_host:
            ref_s, got_s = contract.env_action(ref_out, noise), contract.env_action(got_out, noise)
            e.sample_ok = actions_agree(contract, ref_s, got_s, atol)
        else:  # the graph samples from its noise input: its action output is the sample
            e.sample_ok = actions_agree(contract, contract.env_action(ref_out), contract.env_action(got_out), atol)
            if a.kind == "gaussian" and a.squash != "none" and contract.noise_kind == "normal":
                mean = np.asarray(got_out[a.mean], np.float32)  # type: ignore[index]
                raw = mean + contract.std(got_out, mean.shape) * noise.reshape(mean.shape)
                e.unsquashed_sample = close(contract.env_action(got_out), raw, atol, 0.0)
    return diagnose(e).to_dict()


def _roles(contract: PolicyContract) -> set[str]:
    """The outputs the other evidence judges: the decision heads, the action, the value and the states' next."""
    a = contract.action
    return {
        *a.heads,
        a.distribution_output,
        *filter(None, [a.action, contract.value]),
        *(st.next for st in contract.states),
    }


def actions_agree(contract: PolicyContract, ref: np.ndarray, got: np.ndarray, atol: float) -> bool:
    if np.shape(ref) != np.shape(got):
        return False
    if contract.action.is_discrete:
        return bool(np.array_equal(ref, got))
    return bool(np.allclose(ref, got, atol=atol, rtol=0, equal_nan=True))
