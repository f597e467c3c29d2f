"""The policy contract: what a policy graph takes, what it returns, and how an env action follows from it.

Any policy Cell is described by one contract, whoever trained it:

* inputs, in this order: the observation (one array with its dtype, or a ``Dict`` observation as one input per
  key), an optional sampling-noise input, and optional carried states (``[state.NAME]``: fed back from the output
  ``next`` at the following step, ``init`` at every episode start);
* the outputs in order, and the action kind that turns them into an env action:

  - ``argmax``: an index from Q-values or logits (``values``);
  - ``categorical``: ``logits`` (or ``probs``, an output of probabilities: its log is the logits); deterministic
    = argmax, sampled = Gumbel-max with given uniform noise;
  - ``gaussian``: ``mean`` with ``std`` or ``log_std`` (an output, per state or state-independent, or fixed
    numbers); deterministic = the mean, sampled = ``mean + std * noise`` with given standard-normal noise;
  - ``deterministic``: the output named by ``action`` is the action;
  - ``distributional``: a C51 head, ``values`` ``[batch, actions, atoms]`` probabilities (or ``logits``, a softmax
    over the atoms away) over a ``support`` of returns; the action is the argmax of the expected return (greedy, as
    ``argmax``);

  ``argmax`` and ``categorical`` take a list of outputs for several heads (a ``MultiDiscrete`` action: one index
  per head); continuous actions are optionally squashed to declared bounds (``clip`` or ``tanh``).

Export records the contract in the manifest, verify derives actions and chooses metrics from it, and the deploy
side (``inference.play``) acts with it, so this module is NumPy and stdlib only. The reference for every key is
``examples/bring-your-own/contract-reference.toml``. The parts and the TOML layout are ``contract_layout``
(re-exported here), the arithmetic ``policy_math``, the checks of a contract and of a graph's outputs against it
``contract_checks``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle.contract import checks as contract_checks
from inference.bundle.contract import layout
from inference.bundle.contract.layout import (  # noqa: F401 - re-exported: the contract's parts
    ACTION_KINDS,
    NOISE,
    NOISE_KINDS,
    OBS,
    SQUASHES,
    STATE_INITS,
    ActionSpec,
    ConstantInput,
    Field,
    StateSpec,
    state_dtype,
)
from inference.bundle.policy_math import (  # noqa: F401 - re-exported: the contract's arithmetic
    UNIFORM_EPS,
    argmax_int32,
    gaussian_log_prob,
    gumbel,
    gumbel_argmax,
    log_softmax,
    sample_noise,
    top2_margin,
)
from inference.bundle.tensors import TensorMeta
from inference.bundle.toml_fields import ContractError, Numbers  # noqa: F401 - re-exported


@dataclass(frozen=True)
class PolicyContract:
    """One policy graph: inputs, named outputs and the action derivation; also optional output roles."""

    observations: tuple[Field, ...]
    outputs: tuple[str, ...]
    action: ActionSpec
    noise_shape: tuple[int, ...] | None = None
    noise_kind: str | None = None
    env_id: str | None = None
    value: str | None = None  # optional roles: a critic's value and the log-probability of the action
    log_prob: str | None = None
    states: tuple[StateSpec, ...] = ()
    obs_dict: bool = False  # a Dict observation: one input per key (``observations``), in this order
    constants: tuple[ConstantInput, ...] = ()  # Cell inputs of a fixed value, fed inside the exported graphs
    extra: dict[str, Any] = field(default_factory=dict, compare=False)  # unknown [notes] kept for the manifest

    # -- construction -------------------------------------------------------------------------------
    @classmethod
    def from_toml(cls, path: str | Path) -> PolicyContract:
        data = layout.read_toml(path)
        try:
            return cls.from_dict(data)
        except ContractError as exc:
            raise ContractError(f"contract {path}: {exc}") from None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PolicyContract:
        """Parse the TOML layout (``env_id``, ``[input]``, ``[state.*]``, ``[outputs]``, ``[action]``; every key is
        checked), then check that the fields fit together."""
        contract = cls(**layout.parse(data))
        contract.validate()
        return contract

    def to_dict(self) -> dict[str, Any]:
        """The TOML layout as a plain dict (what the manifest records); ``from_dict`` reads it back."""
        inp: dict[str, Any]
        obs = self.observations[0]
        if self.obs_dict:
            inp = {"obs": {f.name: {"shape": list(f.shape), "dtype": f.dtype} for f in self.observations}}
        elif obs.discrete is not None:
            inp = {"discrete": obs.discrete, **({"obs": list(obs.shape)} if obs.shape else {})}
            if obs.dtype != "int32":
                inp["dtype"] = obs.dtype
        else:
            inp = {"obs": list(self.obs_shape)}
            if obs.dtype != "float32":
                inp["dtype"] = obs.dtype
        if self.noise_shape is not None:
            inp["noise"] = list(self.noise_shape)
            inp["noise_kind"] = self.noise_kind
        for c in self.constants:
            inp[c.name] = {"constant": c.value} if c.flag else {"constant": c.value, "shape": list(c.shape),
                                                                "dtype": c.dtype}  # fmt: skip
        outs: dict[str, Any] = {"names": list(self.outputs)}
        for role in ("value", "log_prob"):
            if getattr(self, role):
                outs[role] = getattr(self, role)
        act: dict[str, Any] = {"kind": self.action.kind}
        for key in ("values", "logits", "probs", "mean", "std", "log_std", "action"):
            value = getattr(self.action, key)
            if value is not None:
                act[key] = value if isinstance(value, str) else list(value)
        if self.action.kind == "deterministic" and self.action.discrete:
            act["discrete"] = True
        if self.action.atoms is not None:
            act["atoms"] = self.action.atoms
        if self.action.support is not None:
            act["support"] = list(self.action.support)
        act["squash"] = self.action.squash
        if self.action.rescale:
            act["rescale"] = True
        if self.action.low is not None:
            act["low"], act["high"] = list(self.action.low), list(self.action.high or ())
        data: dict[str, Any] = {"input": inp, "outputs": outs, "action": act}
        if self.states:
            data["state"] = {s.name: {"shape": list(s.shape), "next": s.next, "init": s.init} for s in self.states}
        if self.env_id:
            data = {"env_id": self.env_id, **data}
        if self.extra:
            data["notes"] = dict(self.extra)
        return data

    def with_env(self, env_id: str | None) -> PolicyContract:
        return replace(self, env_id=env_id)

    # -- inputs -------------------------------------------------------------------------------------
    @property
    def obs_shape(self) -> tuple[int, ...]:
        """The shape of an array observation (a ``Dict`` observation has one per key: ``observations``)."""
        if self.obs_dict:
            raise ContractError("a Dict observation has no single shape: use the contract's observations")
        return self.observations[0].shape

    @property
    def obs_dtype(self) -> np.dtype:
        """The NumPy dtype that holds one observation row: the array's, or a structured one for a Dict."""
        if not self.obs_dict:
            return np.dtype(self.observations[0].dtype)
        return np.dtype([(f.name, f.dtype, f.shape) for f in self.observations])

    def empty_observations(self, n: int) -> np.ndarray:
        """``n`` zero observation rows (``obs_dtype``; an array observation keeps its shape)."""
        if self.obs_dict:
            return np.zeros(n, self.obs_dtype)
        return np.zeros((n, *self.obs_shape), self.obs_dtype)

    def input_metas(self) -> list[TensorMeta]:
        """The graph's inputs in order: observation(s), noise, states (``-1`` the batch). Constant inputs are not
        among them: the exported graphs feed those themselves."""
        metas = [f.meta() for f in self.observations]
        if self.noise_shape is not None:
            metas.append(TensorMeta(NOISE, np.dtype("float32"), (-1, *self.noise_shape)))
        return [*metas, *(s.meta() for s in self.states)]

    def obs_inputs(self, obs: np.ndarray) -> list[np.ndarray]:
        """The graph's observation inputs from a batch of observation rows (``obs_dtype``)."""
        if not self.obs_dict:
            return [np.asarray(obs, self.observations[0].dtype)]
        return [np.ascontiguousarray(obs[f.name]) for f in self.observations]

    def batch_observations(self, rows: Sequence[Any]) -> np.ndarray:
        """Env observations (arrays, or dicts for a ``Dict`` observation) as one batch of rows (``obs_dtype``)."""
        if not self.obs_dict:
            return np.asarray(np.stack([np.asarray(r) for r in rows]), self.observations[0].dtype)
        batch = self.empty_observations(len(rows))
        for f in self.observations:
            batch[f.name] = np.stack([np.asarray(r[f.name]) for r in rows])
        return batch

    def initial_state(self, batch: int) -> np.ndarray | None:
        """Every carried state at an episode start, as rows of a structured array (None without states)."""
        if not self.states:
            return None
        rows = np.zeros(batch, state_dtype(self.states))
        for s in self.states:
            rows[s.name] = s.initial(batch)
        return rows

    def state_inputs(self, state: np.ndarray | None) -> list[np.ndarray]:
        return [] if state is None else [np.ascontiguousarray(state[s.name]) for s in self.states]

    def next_state(self, outputs: Mapping[str, np.ndarray]) -> np.ndarray | None:
        """The states to feed at the next step, from this step's outputs."""
        if not self.states:
            return None
        nexts = {s.name: np.asarray(outputs[s.next], s.dtype) for s in self.states}
        first = nexts[self.states[0].name]  # the batch from a state's own output (other outputs may ignore it)
        batch = first.shape[0] if first.ndim else 1
        rows = np.zeros(batch, state_dtype(self.states))
        for s in self.states:
            if nexts[s.name].size != batch * int(np.prod(s.shape, dtype=np.int64)):
                raise ContractError(f"output {s.next!r} has shape {list(nexts[s.name].shape)}: not {batch} rows of "
                                    f"state {s.name!r} {list(s.shape)}")  # fmt: skip
            rows[s.name] = nexts[s.name].reshape(batch, *s.shape)
        return rows

    # -- checks (``contract_checks``) -------------------------------------------------------------------
    def validate(self) -> None:
        """Internal consistency: names exist, the kind has its keys, bounds are well-formed."""
        contract_checks.validate(self)

    def check_io(self, outputs: Sequence[Any]) -> None:
        """The graph's actual outputs (``TensorMeta``-like: name, dtype, shape with -1 for the batch) fit the
        roles the contract gives them; ``ContractError`` names the first that does not."""
        contract_checks.check_io(self, outputs)

    @property
    def takes_noise(self) -> bool:
        return self.noise_shape is not None

    @property
    def has_deterministic_mode(self) -> bool:
        """The graph can act deterministically: it takes no noise, or its noise only perturbs a decision the contract
        names (a Gaussian's mean, a categorical's scores), so the deterministic action is that decision."""
        return not self.takes_noise or self.action.kind in ("gaussian", "categorical")

    def zero_noise(self, batch: int) -> np.ndarray:
        """The noise a noise-input graph is fed when it acts deterministically: zeros for standard-normal noise (the
        sample is then the mean), 0.5 for uniform noise (a constant Gumbel shift, so the argmax is the scores')."""
        fill = np.float32(0.5) if self.noise_kind == "uniform" else np.float32(0.0)
        return np.full((batch, *(self.noise_shape or ())), fill, np.float32)

    def deterministic_action(self, outputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """The deterministic env action: for a graph without noise ``env_action`` (the graph's own action output
        where it has one); for a noise-input graph the decision its noise perturbs, through the contract's squash:
        the squashed Gaussian mean, or the argmax of every categorical head's scores."""
        a = self.action
        if not self.takes_noise:
            return self.env_action(outputs)
        if a.kind == "gaussian":
            return self.squash(np.asarray(outputs[a.mean], np.float32))  # type: ignore[index]
        if a.kind == "categorical":
            return self._stack([argmax_int32(self.categorical_scores(outputs, h)) for h in range(len(a.heads))])
        raise ContractError(f"a {a.kind} graph that takes noise has no deterministic action")

    def noise_feed(self, mode: str, batch: int, noise: np.ndarray | None) -> list[np.ndarray]:
        """The graph's noise input for one call in ``mode`` (none when the graph takes no noise; zero noise when it
        acts deterministically)."""
        if not self.takes_noise:
            return []
        if mode == "deterministic":
            return [self.zero_noise(batch)]
        if noise is None:
            raise ContractError("a stochastic call of a noise-input graph needs its noise")
        return [noise]

    def mode_action(self, outputs: Mapping[str, np.ndarray], mode: str, noise: np.ndarray | None = None) -> np.ndarray:
        """The env action of one call in ``mode``: the deterministic action, the graph's own sample (noise input),
        or a sample drawn on the host from the outputs with ``noise`` (without noise: the deterministic action)."""
        if mode == "deterministic":
            return self.deterministic_action(outputs)
        if self.takes_noise or noise is None:
            return self.env_action(outputs)
        return self.env_action(outputs, host_noise=noise)

    @property
    def samples_on_host(self) -> bool:
        """Stochastic actions come from host sampling of the outputs (no noise input, a sampling kind)."""
        return not self.takes_noise and self.action.kind in ("categorical", "gaussian")

    @property
    def stochastic_noise_kind(self) -> str | None:
        """The noise a stochastic action needs: the graph's input noise or the host sampler's; None: none."""
        if self.takes_noise:
            return self.noise_kind
        return {"categorical": "uniform", "gaussian": "normal"}.get(self.action.kind)

    # -- acting -------------------------------------------------------------------------------------
    def env_action(self, outputs: Mapping[str, np.ndarray], host_noise: np.ndarray | None = None) -> np.ndarray:
        """The env action batch from one inference's outputs: ``[batch]`` indices, ``[batch, heads]`` indices
        for several heads, or ``[batch, d]`` continuous actions.

        ``host_noise`` (uniform for categorical, standard normal for gaussian) samples on the host from the
        outputs; without it the action is deterministic. A graph with an ``action`` output acts with that
        output (what the deployed graph computes), unless sampling happens here on the host.
        """
        a = self.action
        if host_noise is not None:
            if not self.samples_on_host:
                raise ContractError(f"{a.kind} policy graphs do not sample on the host")
            if a.kind == "categorical":
                parts = self.split_heads(np.asarray(host_noise, np.float32), outputs)
                return self._stack([gumbel_argmax(self.categorical_scores(outputs, h), u) for h, u in parts])
            mean = np.asarray(outputs[a.mean], np.float32)  # type: ignore[index]
            return self.squash(mean + self.std(outputs, mean.shape) * np.asarray(host_noise, np.float32))
        if a.kind == "deterministic":
            out = np.asarray(outputs[a.action])  # type: ignore[index]
            return out if a.discrete else self.squash(out)
        if a.action is not None:
            return np.asarray(outputs[a.action])  # the graph's own env action, already post-processed
        if a.kind in ("argmax", "categorical", "distributional"):
            return self._stack([argmax_int32(self.decision_values(outputs, h)) for h in range(len(a.heads))])
        return self.squash(np.asarray(outputs[a.mean], np.float32))  # type: ignore[index]

    def _stack(self, per_head: list[np.ndarray]) -> np.ndarray:
        return per_head[0] if not self.action.multi_head else np.stack(per_head, -1).astype(np.int32)

    def split_heads(self, noise: np.ndarray, outputs: Mapping[str, np.ndarray]) -> list[tuple[int, np.ndarray]]:
        """Host noise ``[batch, sum of head widths]`` as ``(head, its columns)`` pairs."""
        widths = [np.shape(outputs[h])[-1] for h in self.action.heads]
        edges = np.cumsum([0, *widths])
        return [(k, noise[:, edges[k] : edges[k + 1]]) for k in range(len(widths))]

    def decision_scores(
        self, outputs: Mapping[str, np.ndarray], noise: np.ndarray | None = None, head: int = 0
    ) -> np.ndarray | None:
        """The scores whose argmax is head ``head``'s discrete action: Q-values, logits, or logits plus the Gumbel
        noise of a sample (the noise fed to the graph, or the host's, all heads' columns). None for continuous."""
        a = self.action
        if a.kind in ("argmax", "distributional"):
            return np.asarray(self.decision_values(outputs, head), np.float32)
        if a.kind != "categorical":
            return None
        logits = self.categorical_scores(outputs, head)
        if noise is None:
            return logits
        return logits + gumbel(dict(self.split_heads(np.asarray(noise, np.float32), outputs))[head])

    def decision_values(self, outputs: Mapping[str, np.ndarray], head: int = 0) -> np.ndarray:
        """Head ``head``'s scores as the graph computes them, ``[batch, n]``: its output, or for a distributional
        head the expected return of each action (its probabilities times the support, summed over the atoms)."""
        a = self.action
        values = np.asarray(outputs[a.heads[head]])
        if a.kind != "distributional":
            return values
        probs = np.asarray(values, np.float64)
        if a.logits is not None:  # the atoms' logits, as the C51 networks return them: softmax over the atoms
            probs = np.exp(log_softmax(probs))
        return probs @ a.atom_values

    def categorical_scores(self, outputs: Mapping[str, np.ndarray], head: int = 0) -> np.ndarray:
        """The logits of a categorical head: its logits output, or the log of its probabilities output."""
        a = self.action
        values = np.asarray(outputs[a.heads[head]], np.float32)
        if a.probs is None:
            return values
        with np.errstate(divide="ignore"):
            return np.log(values)

    def log_probs(self, outputs: Mapping[str, np.ndarray], head: int = 0) -> np.ndarray:
        """Normalised log-probabilities of a categorical head (float64)."""
        return log_softmax(self.categorical_scores(outputs, head))

    def std(self, outputs: Mapping[str, np.ndarray], shape: tuple[int, ...]) -> np.ndarray:
        """The Gaussian std broadcast to ``shape``: from an output (per state or not) or from fixed numbers."""
        a = self.action
        spec = a.std if a.std is not None else a.log_std
        raw = np.asarray(outputs[spec] if isinstance(spec, str) else spec, np.float32)
        std = raw if a.std is not None else np.exp(raw)
        return np.broadcast_to(std, shape)

    def squash(self, raw: np.ndarray) -> np.ndarray:
        """Map a raw continuous action to the declared bounds, in float32."""
        a = self.action
        raw = np.asarray(raw, np.float32)
        if a.squash == "none":
            return raw
        low, high = np.asarray(a.low, np.float32), np.asarray(a.high, np.float32)
        center, half = (high + low) / np.float32(2), (high - low) / np.float32(2)
        if a.squash == "tanh":
            return center + half * np.tanh(raw)
        if a.rescale:
            return center + half * np.clip(raw, np.float32(-1), np.float32(1))
        return np.clip(raw, low, high)

    def sample_noise(self, rng: np.random.Generator, batch: int, dim: int) -> np.ndarray:
        """Noise for ``batch`` stochastic actions: uniform or standard normal float32 ``[batch, dim]``."""
        kind = self.stochastic_noise_kind
        if kind is None:
            raise ContractError(f"a {self.action.kind} policy without a noise input has no stochastic mode")
        return sample_noise(rng, kind, batch, dim)
