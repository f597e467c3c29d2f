"""The policy contract's parts (observation fields, carried states, the action derivation) and its TOML layout.

``inference.bundle.contract.PolicyContract`` is made of these parts; ``parse`` reads its TOML layout (a contract file,
or the dict a manifest records) checking every key; ``PolicyContract.to_dict`` writes it back. Reading the layout
is kept apart from what the contract computes (inputs, checks, actions), so either changes without the other. NumPy
and stdlib only. The reference for every key is ``examples/bring-your-own/contract-reference.toml``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle import toml_fields as T
from inference.bundle.files import read_document
from inference.bundle.tensors import TensorMeta
from inference.bundle.toml_fields import ContractError, Numbers

ACTION_KINDS = ("argmax", "categorical", "gaussian", "deterministic", "distributional")
SQUASHES = ("none", "clip", "tanh")
NOISE_KINDS = ("uniform", "normal")
STATE_INITS = ("zeros",)
OBS = "obs"  # the graph input name of an array observation
NOISE = "noise"


@dataclass(frozen=True)
class Field:
    """A named graph input: an array observation (``obs``), one key of a ``Dict`` observation, or a state.

    ``discrete``: a ``Discrete(N)`` observation, integer indices in ``[0, N)`` (an Embedding's table size); its
    shape is ``()`` (the graph input is ``[batch]``) unless the contract gives one."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    discrete: int | None = None

    def meta(self) -> TensorMeta:
        return TensorMeta(self.name, np.dtype(self.dtype), (-1, *self.shape))


@dataclass(frozen=True)
class ConstantInput(Field):
    """An input of the Cell that is the same value in every call (MAPPO's ``masks`` of ones; a ``training = false``
    flag that selects the deterministic branch): the exported graphs take it inside (export feeds ``value`` of
    ``shape`` per row, or the flag as a Python bool), so the deploy side never passes it."""

    value: float | bool = 0.0

    @property
    def flag(self) -> bool:
        return self.dtype == "bool"

    def array(self, batch: int) -> np.ndarray:
        return np.full((batch, *self.shape), self.value, self.dtype)


@dataclass(frozen=True)
class StateSpec(Field):
    """A state the policy carries between steps: fed from output ``next`` at the following step, ``init`` at
    every episode start (the only init today: ``zeros``)."""

    next: str = ""
    init: str = "zeros"

    def initial(self, batch: int) -> np.ndarray:
        return np.zeros((batch, *self.shape), self.dtype)


@dataclass(frozen=True)
class ActionSpec:
    """How an env action is derived from the graph's outputs (the kinds: ``inference.bundle.contract``'s docstring)."""

    kind: str
    values: str | tuple[str, ...] | None = None
    logits: str | tuple[str, ...] | None = None
    probs: str | tuple[str, ...] | None = None  # categorical, instead of logits: outputs of probabilities
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
    # ``distributional`` (C51): ``values`` is ``[batch, actions, atoms]`` probabilities (``logits``: before the softmax
    # over the atoms) over ``support``, the atoms' returns (``atoms`` numbers, or ``[v_min, v_max]`` spaced evenly);
    # the action is the argmax of the expectation
    atoms: int | None = None
    support: Numbers | None = None

    @property
    def is_discrete(self) -> bool:
        return self.kind in ("argmax", "categorical", "distributional") or (self.kind == "deterministic"
                                                                             and self.discrete)  # fmt: skip

    @property
    def atom_values(self) -> np.ndarray:
        """The return of each atom of a distributional head (float64 ``[atoms]``)."""
        support = np.asarray(self.support or (), np.float64)
        if self.atoms and len(support) == 2 and self.atoms != 2:
            return np.linspace(support[0], support[1], self.atoms)
        return support

    @property
    def heads(self) -> tuple[str, ...]:
        """The outputs that carry the decision, one per action head: Q-values (or their distribution), logits or
        probs, the mean, or the action itself."""
        name = {"argmax": self.values, "distributional": self.values or self.logits,
                "categorical": self.logits or self.probs,
                "gaussian": self.mean}.get(self.kind)  # fmt: skip
        name = name or self.action
        return (name,) if isinstance(name, str) else tuple(name or ())

    @property
    def distribution_output(self) -> str:
        """The (first) output that carries the decision."""
        return self.heads[0]

    @property
    def multi_head(self) -> bool:
        return len(self.heads) > 1


def state_dtype(states: Sequence[StateSpec]) -> np.dtype:
    """One row of every carried state, as a structured NumPy dtype (states travel as rows, like observations)."""
    return np.dtype([(s.name, s.dtype, s.shape) for s in states])


def read_toml(path: str | Path) -> dict[str, Any]:
    """A contract file's tables; ``ContractError`` for a missing file or one that is not TOML."""
    return read_document(path, "contract", ContractError)


def parse(data: Mapping[str, Any]) -> dict[str, Any]:
    """The TOML layout (``env_id``, ``[input]``, ``[state.*]``, ``[outputs]``, ``[action]``) as ``PolicyContract``'s
    fields; every key is checked (whether the fields fit together is ``PolicyContract.validate``'s)."""
    T.check_known(data, ("env_id", "input", "state", "outputs", "action", "notes"), "top level")
    inp, outs, act = (T.get_table(data, k) for k in ("input", "outputs", "action"))
    constants = _constants(inp)
    T.check_known({k: v for k, v in inp.items() if k not in constants}, INPUT_KEYS, "[input]",
                  also="or an extra input [input.NAME] with constant = <value>")  # fmt: skip
    T.check_known(outs, ("names", "value", "log_prob"), "[outputs]")
    T.check_known(
        act,
        ("kind", "values", "logits", "probs", "mean", "std", "log_std", "action", "discrete", "squash", "rescale",
         "low", "high", "atoms", "support"),
        "[action]",
    )  # fmt: skip
    if "obs" not in inp and "discrete" not in inp:
        raise ContractError("[input] obs (the observation shape without the batch dim, or a table of them) or "
                            "discrete = N (a Discrete(N) observation: one index) is required")  # fmt: skip
    names = outs.get("names")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise ContractError("[outputs] names must be a non-empty list of output names, in the Cell's order")
    action = ActionSpec(
        kind=T.get_str(act, "kind", None) or "",
        values=T.get_names(act, "values"),
        logits=T.get_names(act, "logits"),
        probs=T.get_names(act, "probs"),
        mean=T.get_str(act, "mean"),
        std=T.get_name_or_numbers(act, "std"),
        log_std=T.get_name_or_numbers(act, "log_std"),
        action=T.get_str(act, "action"),
        discrete=T.get_bool(act, "discrete"),
        squash=T.get_str(act, "squash") or "none",
        rescale=T.get_bool(act, "rescale"),
        low=T.get_numbers(act, "low"),
        high=T.get_numbers(act, "high"),
        atoms=T.get_count(act, "atoms"),
        support=T.get_numbers(act, "support"),
    )
    observations, obs_dict = _observations(inp)
    return dict(
        observations=observations,
        obs_dict=obs_dict,
        outputs=tuple(names),
        action=action,
        noise_shape=T.get_shape(inp["noise"], "[input] noise") if "noise" in inp else None,
        noise_kind=T.get_str(inp, "noise_kind"),
        env_id=T.get_str(data, "env_id"),
        value=T.get_str(outs, "value"),
        log_prob=T.get_str(outs, "log_prob"),
        states=_states(data.get("state", {})),
        constants=tuple(constants.values()),
        extra=dict(data.get("notes", {})),
    )


INPUT_KEYS = ("obs", "dtype", "noise", "noise_kind", "discrete")


def _observations(inp: Mapping[str, Any]) -> tuple[tuple[Field, ...], bool]:
    """``[input] obs = [shape]`` (with ``dtype``), ``[input] discrete = N`` (a ``Discrete(N)`` observation: int32
    indices, shape ``obs`` or none), or ``[input.obs]``: one key per Dict entry, each a shape or a table
    ``{shape, dtype}``."""
    if "discrete" in inp:
        return (_discrete(inp),), False
    obs = inp["obs"]
    default = T.get_dtype(inp.get("dtype", "float32"), "[input] dtype")
    if not isinstance(obs, Mapping):
        return (Field(OBS, T.get_shape(obs, "[input] obs"), default),), False
    if not obs:
        raise ContractError("[input.obs] names no key")
    fields = []
    for key, spec in obs.items():
        where = f"[input.obs] {key}"
        if isinstance(spec, Mapping):
            T.check_known(spec, ("shape", "dtype"), where)
            if "shape" not in spec:
                raise ContractError(f"{where} needs a shape")
            shape, dtype = T.get_shape(spec["shape"], f"{where} shape"), T.get_dtype(spec.get("dtype", default), where)
        else:
            shape, dtype = T.get_shape(spec, where), default
        fields.append(Field(key, shape, dtype))
    return tuple(fields), True


def _discrete(inp: Mapping[str, Any]) -> Field:
    n = T.get_count(inp, "discrete")
    if n is None or n < 2:
        raise ContractError(f"[input] discrete must be the number of observations N >= 2, got {inp['discrete']!r}")
    if isinstance(inp.get("obs"), Mapping):
        raise ContractError("[input] discrete describes one index observation, not a Dict ([input.obs] keys)")
    shape = T.get_shape(inp["obs"], "[input] obs") if "obs" in inp else ()
    dtype = T.get_dtype(inp.get("dtype", "int32"), "[input] dtype")
    if np.dtype(dtype).kind not in "iu" or np.iinfo(np.dtype(dtype)).max < n - 1:
        raise ContractError(f"[input] discrete observations are integer indices: dtype int32 or int64, not {dtype}")
    return Field(OBS, shape, dtype, discrete=n)


def _constants(inp: Mapping[str, Any]) -> dict[str, ConstantInput]:
    """``[input.NAME]`` tables with ``constant = <value>`` (and ``shape``, default ``[1]``; ``dtype``, default
    float32), or ``constant = true|false`` (a Python flag argument): Cell inputs after the observation(s), noise
    and states, in this order."""
    found = {}
    for name, spec in inp.items():
        if name in INPUT_KEYS or not isinstance(spec, Mapping):
            continue
        where = f"[input.{name}]"
        T.check_known(spec, ("constant", "shape", "dtype"), where)
        if isinstance(spec.get("constant"), bool):
            if set(spec) != {"constant"}:
                raise ContractError(f"{where}: a flag (constant = true/false) has no shape or dtype")
            found[name] = ConstantInput(name, (), "bool", value=spec["constant"])
            continue
        if not T.is_number(spec.get("constant")):
            raise ContractError(f"{where}: an extra input needs constant = <a finite number> (its value in every call)")
        shape = T.get_shape(spec.get("shape", [1]), f"{where} shape")
        dtype = T.get_dtype(spec.get("dtype", "float32"), f"{where} dtype")
        value = float(spec["constant"])
        if np.dtype(dtype).kind in "iu" and value != int(value):
            raise ContractError(f"{where}: constant {value} is not an integer, the input is {dtype}")
        found[name] = ConstantInput(name, shape, dtype, value=value)
    return found


def _states(table: Any) -> tuple[StateSpec, ...]:
    """``[state.NAME]`` tables, in order: ``shape``, ``next`` (the output fed back) and ``init``."""
    if not isinstance(table, Mapping):
        raise ContractError("[state] must be a table of [state.NAME] tables")
    states = []
    for name, spec in table.items():
        where = f"[state.{name}]"
        if not isinstance(spec, Mapping):
            raise ContractError(f"{where} must be a table with shape, next and init")
        T.check_known(spec, ("shape", "next", "init", "dtype"), where)
        nxt = T.get_str(spec, "next")
        if "shape" not in spec or not nxt:
            raise ContractError(f'{where} needs shape = [...] and next = "<output fed back>"')
        init = T.get_str(spec, "init", "zeros")
        if init not in STATE_INITS:
            raise ContractError(f"{where} init must be one of {', '.join(STATE_INITS)}, got {init!r}")
        dtype = T.get_dtype(spec.get("dtype", "float32"), f"{where} dtype")
        shape = T.get_shape(spec["shape"], f"{where} shape")
        states.append(StateSpec(name, shape, dtype, next=nxt, init=init or "zeros"))
    return tuple(states)
