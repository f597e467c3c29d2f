"""The policy contract: what a policy graph takes, what it returns, and how an env action follows from it.

Any policy Cell is described by one contract, whoever trained it: the observation input (and an optional
sampling-noise input), the outputs in order, and the action kind that turns outputs into an env action:

* ``argmax``: an index from Q-values or logits (``values``);
* ``categorical``: ``logits`` (or ``probs``, an output of probabilities: its log is the logits); deterministic =
  argmax, sampled = Gumbel-max with given uniform noise;
* ``gaussian``: ``mean`` with ``std`` or ``log_std`` (an output, per state or state-independent, or fixed
  numbers); deterministic = the mean, sampled = ``mean + std * noise`` with given standard-normal noise;
* ``deterministic``: the output named by ``action`` is the action;

each optionally squashed to declared bounds (``clip`` or ``tanh``). Export records the contract in the
manifest, verify derives actions and chooses metrics from it, and the deploy side (``inference.play``)
acts with it, so this module is NumPy and stdlib only. The reference for every key is
``examples/bring-your-own/contract-reference.toml``.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

ACTION_KINDS = ("argmax", "categorical", "gaussian", "deterministic")
SQUASHES = ("none", "clip", "tanh")
NOISE_KINDS = ("uniform", "normal")
# Uniform noise is kept away from 0 and 1 so that -log(-log(u)) stays finite in float32, as in our graphs
# (``msrl_consistency.agent.distributions``; 1e-6 because MindSpore's CPU log is 0 at 1 - 1.2e-7).
UNIFORM_EPS = np.float32(1e-6)
_ROLE_KEYS = {"argmax": ("values",), "categorical": (), "gaussian": ("mean",), "deterministic": ("action",)}


class ContractError(ValueError):
    """The contract is malformed or disagrees with the policy it describes (a usage error: exit 2)."""

    exit_code = 2


Numbers = tuple[float, ...]


@dataclass(frozen=True)
class ActionSpec:
    """How an env action is derived from the graph's outputs (see the module docstring)."""

    kind: str
    values: str | None = None
    logits: str | None = None
    probs: str | None = None  # categorical only, instead of logits: an output of probabilities (rows sum to 1)
    mean: str | None = None
    std: str | Numbers | None = None
    log_std: str | Numbers | None = None
    # ``deterministic``: the output that is the (raw) action. Other kinds: optionally the graph's own env-action
    # output, already post-processed in the graph; the env is then driven by it (what the deployed graph does).
    action: str | None = None
    discrete: bool = False  # deterministic kind only: the action output is an index
    squash: str = "none"
    rescale: bool = False  # clip only: the raw value lives in [-1, 1] and is mapped onto [low, high] first
    low: Numbers | None = None
    high: Numbers | None = None

    @property
    def is_discrete(self) -> bool:
        return self.kind in ("argmax", "categorical") or (self.kind == "deterministic" and self.discrete)

    @property
    def distribution_output(self) -> str:
        """The output that carries the decision: Q-values, logits, mean or the action itself."""
        name = {"argmax": self.values, "categorical": self.logits or self.probs, "gaussian": self.mean}.get(self.kind)
        return name or self.action  # type: ignore[return-value]


@dataclass(frozen=True)
class PolicyContract:
    """One policy graph: inputs, named outputs and the action derivation; also optional output roles."""

    obs_shape: tuple[int, ...]
    outputs: tuple[str, ...]
    action: ActionSpec
    noise_shape: tuple[int, ...] | None = None
    noise_kind: str | None = None
    env_id: str | None = None
    value: str | None = None  # optional roles: a critic's value and the log-probability of the action
    log_prob: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)  # unknown [notes] kept for the manifest

    # -- construction -------------------------------------------------------------------------------
    @classmethod
    def from_toml(cls, path: str | Path) -> PolicyContract:
        path = Path(path)
        if not path.is_file():
            raise ContractError(f"contract file not found: {path}")
        try:
            data = tomllib.loads(path.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ContractError(f"contract {path} is not valid TOML: {exc}") from None
        try:
            return cls.from_dict(data)
        except ContractError as exc:
            raise ContractError(f"contract {path}: {exc}") from None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PolicyContract:
        """Parse the TOML layout (``env_id``, ``[input]``, ``[outputs]``, ``[action]``); every key is checked."""
        _known(data, ("env_id", "input", "outputs", "action", "notes"), "top level")
        inp, outs, act = (_table(data, k) for k in ("input", "outputs", "action"))
        _known(inp, ("obs", "noise", "noise_kind"), "[input]")
        _known(outs, ("names", "value", "log_prob"), "[outputs]")
        _known(
            act,
            ("kind", "values", "logits", "probs", "mean", "std", "log_std", "action", "discrete", "squash", "rescale",
             "low", "high"),
            "[action]",
        )  # fmt: skip
        if "obs" not in inp:
            raise ContractError("[input] obs (the observation shape without the batch dim) is required")
        names = outs.get("names")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
            raise ContractError("[outputs] names must be a non-empty list of output names, in the Cell's order")
        action = ActionSpec(
            kind=_str(act, "kind", None) or "",
            values=_str(act, "values"),
            logits=_str(act, "logits"),
            probs=_str(act, "probs"),
            mean=_str(act, "mean"),
            std=_name_or_numbers(act, "std"),
            log_std=_name_or_numbers(act, "log_std"),
            action=_str(act, "action"),
            discrete=_bool(act, "discrete"),
            squash=_str(act, "squash") or "none",
            rescale=_bool(act, "rescale"),
            low=_numbers(act, "low"),
            high=_numbers(act, "high"),
        )
        contract = cls(
            obs_shape=_shape(inp["obs"], "[input] obs"),
            outputs=tuple(names),
            action=action,
            noise_shape=_shape(inp["noise"], "[input] noise") if "noise" in inp else None,
            noise_kind=_str(inp, "noise_kind"),
            env_id=_str(data, "env_id"),
            value=_str(outs, "value"),
            log_prob=_str(outs, "log_prob"),
            extra=dict(data.get("notes", {})),
        )
        contract.validate()
        return contract

    def to_dict(self) -> dict[str, Any]:
        """The TOML layout as a plain dict (what the manifest records); ``from_dict`` reads it back."""
        inp: dict[str, Any] = {"obs": list(self.obs_shape)}
        if self.noise_shape is not None:
            inp["noise"] = list(self.noise_shape)
            inp["noise_kind"] = self.noise_kind
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
        act["squash"] = self.action.squash
        if self.action.rescale:
            act["rescale"] = True
        if self.action.low is not None:
            act["low"], act["high"] = list(self.action.low), list(self.action.high or ())
        data: dict[str, Any] = {"input": inp, "outputs": outs, "action": act}
        if self.env_id:
            data = {"env_id": self.env_id, **data}
        if self.extra:
            data["notes"] = dict(self.extra)
        return data

    def with_env(self, env_id: str | None) -> PolicyContract:
        return replace(self, env_id=env_id)

    # -- checks -------------------------------------------------------------------------------------
    def validate(self) -> None:
        """Internal consistency: names exist, the kind has its keys, bounds are well-formed."""
        a = self.action
        if a.kind not in ACTION_KINDS:
            raise ContractError(f"[action] kind must be one of {', '.join(ACTION_KINDS)}, got {a.kind!r}")
        if len(set(self.outputs)) != len(self.outputs):
            raise ContractError(f"[outputs] names repeat a name: {list(self.outputs)}")
        for key in _ROLE_KEYS[a.kind]:
            if getattr(a, key) is None:
                raise ContractError(f"[action] kind {a.kind!r} needs {key} = \"<output name>\"")
        if a.kind == "gaussian" and (a.std is None) == (a.log_std is None):
            raise ContractError("[action] kind 'gaussian' needs exactly one of std or log_std")
        if a.kind == "categorical" and (a.logits is None) == (a.probs is None):
            raise ContractError("[action] kind 'categorical' needs exactly one of logits = \"<output>\" or probs = "
                                "\"<output>\"")  # fmt: skip
        if a.probs is not None and a.kind != "categorical":
            raise ContractError(f"[action] probs applies to kind 'categorical' only, not {a.kind!r}")
        refs = {"values": a.values, "logits": a.logits, "probs": a.probs, "mean": a.mean, "action": a.action}
        refs.update({k: v for k, v in (("std", a.std), ("log_std", a.log_std)) if isinstance(v, str)})
        refs.update({"[outputs] value": self.value, "[outputs] log_prob": self.log_prob})
        for key, name in refs.items():
            if name is not None and name not in self.outputs:
                raise ContractError(f"{key} = {name!r} is not one of the outputs {list(self.outputs)}")
        if a.squash not in SQUASHES:
            raise ContractError(f"[action] squash must be one of {', '.join(SQUASHES)}, got {a.squash!r}")
        if a.squash != "none" or a.rescale:
            if a.low is None or a.high is None:
                raise ContractError(f"[action] squash = {a.squash!r} needs low and high bounds")
            if len(a.low) != len(a.high) or any(lo >= hi for lo, hi in zip(a.low, a.high, strict=True)):
                raise ContractError(f"[action] low {list(a.low)} and high {list(a.high)} must pair up with low < high")
        if a.rescale and a.squash != "clip":
            raise ContractError("[action] rescale applies to squash = 'clip' only (tanh always maps [-1, 1])")
        if a.is_discrete and a.squash != "none":
            raise ContractError(f"[action] a discrete action ({a.kind}) cannot be squashed")
        if self.noise_shape is not None:
            if self.noise_kind not in NOISE_KINDS:
                raise ContractError(f"[input] noise_kind must be one of {', '.join(NOISE_KINDS)} when noise is given")
            if a.action is None:
                raise ContractError("a graph that takes noise samples inside: name its sampled output [action] action")
        elif self.noise_kind is not None:
            raise ContractError("[input] noise_kind without a noise input")

    def check_io(self, outputs: Sequence[Any]) -> None:
        """The graph's actual outputs (``TensorMeta``-like: name, dtype, shape with -1 for the batch) fit the
        roles the contract gives them; ``ContractError`` names the first that does not."""
        if len(outputs) != len(self.outputs):
            raise ContractError(f"the graph returns {len(outputs)} output(s), the contract names {len(self.outputs)}")
        meta = {name: out for name, out in zip(self.outputs, outputs, strict=True)}
        a = self.action

        def need(name: str | None, what: str, ranks: tuple[int, ...], batched: bool = True) -> tuple[int, ...]:
            shape = tuple(meta[name].shape)  # type: ignore[index]
            if len(shape) not in ranks or (batched and shape[:1] != (-1,)):
                want = " or ".join(f"[batch{', n' * (r - 1)}]" for r in ranks)
                raise ContractError(f"{what} output {name!r} has shape {list(shape)}, expected {want}")
            return shape

        decision = a.distribution_output
        if a.kind in ("argmax", "categorical"):
            role = "values" if a.kind == "argmax" else ("probs" if a.probs else "logits")
            shape = need(decision, f"{a.kind} {role}", (2,))
            if shape[1] < 2:
                raise ContractError(f"{a.kind} output {decision!r} has {shape[1]} entries; an index needs >= 2")
        width = None
        if a.kind == "gaussian":
            width = need(decision, "gaussian mean", (2,))[1]
            for key in ("std", "log_std"):
                spec = getattr(a, key)
                if isinstance(spec, str):
                    shape = tuple(meta[spec].shape)
                    if shape[-1:] not in ((width,), (1,)) or len(shape) > 2:
                        raise ContractError(f"gaussian {key} output {spec!r} has shape {list(shape)}, expected "
                                            f"[batch, {width}] or a state-independent [{width}]")  # fmt: skip
                elif spec is not None and len(spec) not in (1, width):
                    raise ContractError(f"gaussian {key} has {len(spec)} numbers for a {width}-dim action")
        if a.kind == "deterministic":
            shape = need(decision, "action", (1,) if a.discrete else (2,))
            width = None if a.discrete else shape[1]
        elif a.action is not None:
            shape = need(a.action, "env action", (1,) if a.is_discrete else (2,))
            width = width if a.is_discrete else shape[1]
        if a.low is not None and width is not None and len(a.low) not in (1, width):
            raise ContractError(f"[action] low/high have {len(a.low)} entries for a {width}-dim action")
        for role in ("value", "log_prob"):
            name = getattr(self, role)
            if name is not None:
                need(name, role, (1, 2))
        for name in self.outputs:
            dtype = np.dtype(meta[name].dtype)
            if dtype.kind not in "fiu":
                raise ContractError(f"output {name!r} has dtype {dtype}, expected a number type")
            if dtype.kind != "f" and name != a.action:
                raise ContractError(f"output {name!r} has dtype {dtype}; only a discrete action may be an integer")

    @property
    def takes_noise(self) -> bool:
        return self.noise_shape is not None

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
        """The env action batch from one inference's outputs.

        ``host_noise`` (uniform for categorical, standard normal for gaussian) samples on the host from the
        outputs; without it the action is deterministic. A graph with an ``action`` output acts with that
        output (what the deployed graph computes), unless sampling happens here on the host.
        """
        a = self.action
        if host_noise is not None:
            if not self.samples_on_host:
                raise ContractError(f"{a.kind} policy graphs do not sample on the host")
            if a.kind == "categorical":
                return gumbel_argmax(self.categorical_scores(outputs), host_noise)
            mean = np.asarray(outputs[a.mean], np.float32)  # type: ignore[index]
            return self.squash(mean + self.std(outputs, mean.shape) * np.asarray(host_noise, np.float32))
        if a.kind == "deterministic":
            out = np.asarray(outputs[a.action])  # type: ignore[index]
            return out if a.discrete else self.squash(out)
        if a.action is not None:
            return np.asarray(outputs[a.action])  # the graph's own env action, already post-processed
        if a.kind in ("argmax", "categorical"):
            return argmax_int32(outputs[a.distribution_output])
        return self.squash(np.asarray(outputs[a.mean], np.float32))  # type: ignore[index]

    def decision_scores(self, outputs: Mapping[str, np.ndarray], noise: np.ndarray | None = None) -> np.ndarray | None:
        """The scores whose argmax is the discrete action: Q-values, logits, or logits plus the Gumbel noise of a
        sample (the noise fed to the graph, or the host's). None for continuous actions."""
        a = self.action
        if a.kind == "argmax":
            return np.asarray(outputs[a.values], np.float32)  # type: ignore[index]
        if a.kind != "categorical":
            return None
        logits = self.categorical_scores(outputs)
        return logits if noise is None else logits + gumbel(noise)

    def categorical_scores(self, outputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """The logits of a categorical action: the logits output, or the log of the probabilities output."""
        a = self.action
        if a.probs is None:
            return np.asarray(outputs[a.logits], np.float32)  # type: ignore[index]
        with np.errstate(divide="ignore"):
            return np.log(np.asarray(outputs[a.probs], np.float32))

    def log_probs(self, outputs: Mapping[str, np.ndarray]) -> np.ndarray:
        """Normalised log-probabilities of a categorical action (float64)."""
        return log_softmax(self.categorical_scores(outputs))

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


# -- NumPy mirrors of the in-graph operations ---------------------------------------------------------
def sample_noise(rng: np.random.Generator, kind: str, batch: int, dim: int) -> np.ndarray:
    """The project's one noise generator: ``random()`` for uniform, ``standard_normal()`` for normal."""
    if kind == "uniform":
        return rng.random((batch, dim), dtype=np.float32)
    return rng.standard_normal((batch, dim), dtype=np.float32)


def argmax_int32(x: np.ndarray) -> np.ndarray:
    return np.argmax(np.asarray(x), axis=-1).astype(np.int32)


def gumbel(uniform: np.ndarray) -> np.ndarray:
    """Gumbel noise ``-log(-log(u))`` from uniform noise clamped away from 0 and 1, as the exported graphs do."""
    u = np.clip(np.asarray(uniform, np.float32), UNIFORM_EPS, np.float32(1) - UNIFORM_EPS)
    return -np.log(-np.log(u))


def gumbel_argmax(logits: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """argmax(logits + Gumbel(u)): a sample from softmax(logits), as the exported graphs compute it."""
    return argmax_int32(np.asarray(logits, np.float32) + gumbel(uniform))


def top2_margin(scores: np.ndarray, values: np.ndarray | None = None) -> np.ndarray:
    """Per row ``[margin, |v1|, |v2|, max |v|]``: the gap between the two largest scores, the magnitude of the
    judged output (``values``: logits or Q-values without any Gumbel noise; default the scores) at those two
    entries, and the row's largest magnitude. What a flip between the two is judged with."""
    scores = np.asarray(scores, np.float64)
    values = scores if values is None else np.asarray(values, np.float64)
    order = np.argsort(scores, -1)[..., -2:]
    top = np.take_along_axis(scores, order, -1)
    magnitude = np.abs(np.take_along_axis(values, order, -1))
    row_max = np.where(np.isfinite(values), np.abs(values), 0.0).max(-1)
    return np.stack([top[..., 1] - top[..., 0], magnitude[..., 1], magnitude[..., 0], row_max], -1)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def gaussian_log_prob(mean: np.ndarray, std: np.ndarray, x: np.ndarray) -> np.ndarray:
    mean, std, x = (np.asarray(v, np.float64) for v in (mean, std, x))
    z = (x - mean) / std
    return (-0.5 * z * z - np.log(std) - 0.5 * math.log(2 * math.pi)).sum(-1)


# -- TOML parsing helpers ------------------------------------------------------------------------------
def _table(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key)
    if not isinstance(value, Mapping):
        raise ContractError(f"missing table [{key}]")
    return value


def _known(table: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise ContractError(f"unknown key(s) in {where}: {', '.join(unknown)} (known: {', '.join(allowed)})")


def _str(table: Mapping[str, Any], key: str, default: str | None = None) -> str | None:
    value = table.get(key, default)
    if value is not None and not isinstance(value, str):
        raise ContractError(f"{key} must be a string, got {value!r}")
    return value


def _bool(table: Mapping[str, Any], key: str) -> bool:
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise ContractError(f"{key} must be true or false, got {value!r}")
    return value


def _numbers(table: Mapping[str, Any], key: str) -> Numbers | None:
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value or not all(_is_number(v) for v in value):
        raise ContractError(f"{key} must be a list of finite numbers, got {value!r}")
    return tuple(float(v) for v in value)


def _name_or_numbers(table: Mapping[str, Any], key: str) -> str | Numbers | None:
    value = table.get(key)
    return value if isinstance(value, str) else _numbers(table, key)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _shape(value: Any, where: str) -> tuple[int, ...]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(d, int) and d > 0 for d in value):
        raise ContractError(f"{where} must be a shape without the batch dim, e.g. [3], got {value!r}")
    return tuple(value)


# -- our own trainer's graphs as contracts -------------------------------------------------------------
def trainer_contracts(
    policy_spec: Mapping[str, Any],
    log_std: Sequence[float] | None,
    env_id: str | None,
    sample_outputs: Sequence[str] | None = None,
) -> dict[str, PolicyContract]:
    """The two graphs ``msrl_consistency.train`` exports, as instances of the general contract.

    ``policy``: obs → (env action, logits | mean), the action post-processed in the graph; ``policy_sample``:
    (obs, noise) → (env action, log-prob, value, logits | mean), sampling in the graph from the given noise
    (Gumbel-max of the logits, or the mean plus std times the noise, post-processed). ``sample_outputs`` is the
    sampling graph's output list: bundles of schema v1 had no logits/mean output there, and their sampling graph
    is then described as the deterministic kind (the action output is the action). None: the current layout.
    """
    discrete = policy_spec["action_kind"] == "discrete"
    obs = (int(policy_spec["obs_dim"]),)
    param = "logits" if discrete else "mean"
    if discrete:
        det = ActionSpec("categorical", logits=param, action="action")
    else:
        mode = policy_spec.get("action_postprocess", "clip")
        det = ActionSpec(
            "gaussian",
            mean=param,
            log_std=tuple(float(v) for v in (log_std or [])) or None,
            action="action",
            squash=mode,
            rescale=mode == "clip",
            low=tuple(policy_spec["action_low"]),
            high=tuple(policy_spec["action_high"]),
        )
    names = ("action", "log_prob", "value")
    if sample_outputs is None or param in sample_outputs:
        names, sample = (*names, param), det
    else:
        sample = ActionSpec("deterministic", action="action", discrete=discrete)
    noise = {"noise_shape": (int(policy_spec["action_dim"]),), "noise_kind": "uniform" if discrete else "normal"}
    contracts = {
        "policy": PolicyContract(obs, ("action", param), det, env_id=env_id),
        "policy_sample": PolicyContract(obs, names, sample, env_id=env_id, value="value", log_prob="log_prob", **noise),
    }
    for contract in contracts.values():
        contract.validate()
    return contracts
