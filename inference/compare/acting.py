"""How a set of runtimes (one per bundle graph) acts in an env, as the bundle's contracts say.

Deterministic mode acts through the graph without a noise input. Stochastic mode acts through the graph
that takes noise (sampling in the graph), or samples on the host from the deterministic graph's outputs
(categorical or Gaussian contracts). Every runtime, the reference included, acts through this one code path,
so the only thing that can differ between them is what their graphs compute.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from inference.bundle import MODES, Bundle
from inference.compare.episodes import Policy
from inference.runtimes.base import Runtime


def available_modes(bundle: Bundle) -> dict[str, str]:
    """Mode → the graph that acts in it, for the modes this bundle has."""
    return {mode: graph for mode in MODES if (graph := bundle.mode_graph(mode)) is not None}


def mode_policy(bundle: Bundle, runtimes: Mapping[str, Runtime], mode: str) -> Policy:
    """``(obs, noise | None) -> env actions`` for ``mode`` through ``runtimes``."""
    graph = bundle.mode_graph(mode)
    if graph is None:
        raise ValueError(f"bundle {bundle.root} has no {mode} mode")
    contract, runtime = bundle.contract(graph), runtimes[graph]

    def act(obs: np.ndarray, noise: np.ndarray | None) -> np.ndarray:
        if noise is None or mode == "deterministic":
            return contract.env_action(runtime.infer(obs))
        if contract.takes_noise:
            return contract.env_action(runtime.infer(obs, noise))
        return contract.env_action(runtime.infer(obs), host_noise=noise)

    return act


def is_discrete(bundle: Bundle) -> bool:
    return bundle.contract(bundle.graphs[0]).action.is_discrete
