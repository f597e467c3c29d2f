"""How a set of runtimes (one per bundle graph) acts in an env, as the bundle's contracts say.

Deterministic mode acts through the graph without a noise input. Stochastic mode acts through the graph
that takes noise (sampling in the graph), or samples on the host from the deterministic graph's outputs
(categorical or Gaussian contracts). A policy that carries state is fed its own previous ``next`` outputs, from
its ``init`` at every episode start: each runtime from its own previous output, which is how drift accumulates on
a device. Every runtime, the reference included, acts through this one code path, so the only thing that can
differ between them is what their graphs compute.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from inference.bundle import MODES, Bundle
from inference.bundle.contract import PolicyContract
from inference.runtimes.base import InferenceFailed, Runtime


def available_modes(bundle: Bundle) -> dict[str, str]:
    """Mode → the graph that acts in it, for the modes this bundle has."""
    return {mode: graph for mode in MODES if (graph := bundle.mode_graph(mode)) is not None}


class ModePolicy:
    """``act(obs, noise | None) -> env actions`` for one mode through one runtime, carrying the policy's state
    between calls (``reset`` at an episode start; ``state`` is what the next call is fed)."""

    def __init__(self, bundle: Bundle, runtimes: Mapping[str, Runtime], mode: str) -> None:
        graph = bundle.mode_graph(mode)
        if graph is None:
            raise ValueError(f"bundle {bundle.root} has no {mode} mode")
        self.mode, self.contract, self.runtime = mode, bundle.contract(graph), runtimes[graph]
        self.declared = {o["name"]: tuple(o["shape"]) for o in bundle.graph(graph)["outputs"]}
        self.state: np.ndarray | None = None
        # called with every call's outputs and noise (the reference records its decision margins as it acts)
        self.on_outputs: Callable[[Mapping[str, np.ndarray], np.ndarray | None], None] | None = None

    def reset(self, batch: int) -> None:
        self.state = self.contract.initial_state(batch)

    def outputs(self, obs: np.ndarray, noise: np.ndarray | None) -> dict[str, np.ndarray]:
        """One inference on observation rows (and the graph's noise, when it takes it: zero noise when it acts
        deterministically) with the current state."""
        c = self.contract
        if c.states and (self.state is None or len(self.state) != len(obs)):
            self.reset(len(obs))
        outputs = self.runtime.infer(*c.obs_inputs(obs), *c.noise_feed(self.mode, len(obs), noise),
                                     *c.state_inputs(self.state))  # fmt: skip
        check_batch(getattr(self.runtime, "name", "the runtime"), self.declared, outputs, len(obs))
        return outputs

    def act(self, obs: np.ndarray, noise: np.ndarray | None) -> np.ndarray:
        """The env actions for ``obs``; the state moves on to this step's ``next`` outputs."""
        outputs = self.outputs(obs, noise)
        if self.on_outputs is not None:
            self.on_outputs(outputs, noise)
        self.state = self.contract.next_state(outputs)
        return self.contract.mode_action(outputs, self.mode, noise)

    __call__ = act


class WrongBatch(InferenceFailed):
    """A runtime answered with another batch than it was fed (a dynamic-batch graph that kept an earlier call's)."""


def check_batch(runtime: str, declared: Mapping[str, tuple[int, ...]], outputs: Mapping[str, np.ndarray],
                batch: int) -> None:  # fmt: skip
    """Every output the graph declares batched (``-1`` first) has ``batch`` rows, else ``WrongBatch`` with the
    shapes: a failure of that runtime, with its evidence, never a reshape error further on."""
    for name, shape in declared.items():
        got = outputs.get(name)
        if got is not None and shape[:1] == (-1,) and np.ndim(got) and np.shape(got)[0] != batch:
            raise WrongBatch(
                f"{runtime} returned output {name!r} of shape {list(np.shape(got))} for a batch of "
                f"{batch} (the graph declares {list(shape)}): the graph does not follow the batch it is "
                "fed (a dynamic batch fixed at an earlier call's, or a shape frozen at export)"
            )


def mode_policy(bundle: Bundle, runtimes: Mapping[str, Runtime], mode: str) -> ModePolicy:
    return ModePolicy(bundle, runtimes, mode)


def is_discrete(bundle: Bundle) -> bool:
    return bundle.contract(bundle.graphs[0]).action.is_discrete


def to_env(contract: PolicyContract, action: np.ndarray) -> int | np.ndarray:
    """One env's action from a batch row: an ``int`` index, an index per head (``MultiDiscrete``), or a vector."""
    if contract.action.is_discrete:
        return int(action) if np.ndim(action) == 0 else np.asarray(action, np.int64)
    return action
