"""The policy contract's checks: its own consistency (``validate``) and a graph's outputs against it (``check_io``).

``PolicyContract.validate`` and ``PolicyContract.check_io`` call these; each ``ContractError`` names the first key or
output that is wrong, in the TOML's words.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from inference.bundle import toml_fields as T
from inference.bundle.contract.layout import (
    ACTION_KINDS,
    NOISE_KINDS,
    SQUASHES,
    ActionSpec,
    ConstantInput,
    Field,
    StateSpec,
)
from inference.bundle.tensors import TensorMeta
from inference.bundle.toml_fields import ContractError


class ContractParts(Protocol):
    """What the checks read of a ``PolicyContract`` (which calls them, so this module cannot import it)."""

    @property
    def observations(self) -> tuple[Field, ...]: ...
    @property
    def outputs(self) -> tuple[str, ...]: ...
    @property
    def action(self) -> ActionSpec: ...
    @property
    def noise_shape(self) -> tuple[int, ...] | None: ...
    @property
    def noise_kind(self) -> str | None: ...
    @property
    def value(self) -> str | None: ...
    @property
    def log_prob(self) -> str | None: ...
    @property
    def states(self) -> tuple[StateSpec, ...]: ...
    @property
    def obs_dict(self) -> bool: ...
    @property
    def constants(self) -> tuple[ConstantInput, ...]: ...

    def input_metas(self) -> list[TensorMeta]: ...


# The output each action kind needs named (``validate``).
_ROLE_KEYS = {
    "argmax": ("values",),
    "categorical": (),
    "gaussian": ("mean",),
    "deterministic": ("action",),
    "distributional": ("atoms", "support"),
}


MAX_NAME = 128  # a tensor name a runtime, a report page and a file name all carry


def check_name(name: Any, where: str) -> None:
    """A name the runtimes, reports and recordings carry: a non-empty printable string (no NUL, newline or other
    control character) of at most ``MAX_NAME`` characters."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME or not name.isprintable():
        raise ContractError(f"{where}: {name!r} is not a usable name (printable, 1-{MAX_NAME} characters)")


def validate(contract: ContractParts) -> None:
    """Internal consistency: names exist, the kind has its keys, bounds are well-formed."""
    a = contract.action
    for f in contract.observations:  # parse() checked these already; a contract built in code (v1 bundles) too
        T.check_shape(f.shape, f"[input] obs {f.name}" if contract.obs_dict else "[input] obs")
    for s in contract.states:
        T.check_shape(s.shape, f"[state.{s.name}] shape")
    if contract.noise_shape is not None:
        T.check_shape(contract.noise_shape, "[input] noise")
    for key in ("std", "log_std", "low", "high"):
        numbers = getattr(a, key)
        if isinstance(numbers, tuple) and not all(T.is_number(v) and abs(v) <= T.FLOAT32_MAX for v in numbers):
            raise ContractError(f"[action] {key} must be finite numbers within float32's range")
    if isinstance(a.std, tuple) and min(a.std) <= 0:
        raise ContractError(f"[action] std must be > 0, got {list(a.std)}")
    if a.kind not in ACTION_KINDS:
        raise ContractError(f"[action] kind must be one of {', '.join(ACTION_KINDS)}, got {a.kind!r}")
    if len(set(contract.outputs)) != len(contract.outputs):
        raise ContractError(f"[outputs] names repeat a name: {list(contract.outputs)}")
    for name in contract.outputs:
        check_name(name, "[outputs] names")
    for f in contract.observations if contract.obs_dict else ():
        check_name(f.name, "[input] obs")
    for s in contract.states:
        check_name(s.name, "[state]")
    for key in _ROLE_KEYS[a.kind]:
        if getattr(a, key) is None:
            raise ContractError(f'[action] kind {a.kind!r} needs {key} = "<output name>"')
    if a.kind == "gaussian" and (a.std is None) == (a.log_std is None):
        raise ContractError("[action] kind 'gaussian' needs exactly one of std or log_std")
    if a.kind == "categorical" and (a.logits is None) == (a.probs is None):
        raise ContractError("[action] kind 'categorical' needs exactly one of logits = \"<output>\" or probs = "
                            "\"<output>\"")  # fmt: skip
    if a.probs is not None and a.kind != "categorical":
        raise ContractError(f"[action] probs applies to kind 'categorical' only, not {a.kind!r}")
    refs = {f"[action] {k}": v for k in ("mean", "action") if (v := getattr(a, k)) is not None}
    refs.update({f"[action] {k}": v for k in ("std", "log_std") if isinstance(v := getattr(a, k), str)})
    refs.update({f"[action] {a.kind} head": head for head in a.heads})
    refs.update({"[outputs] value": contract.value, "[outputs] log_prob": contract.log_prob})
    refs.update({f"[state.{s.name}] next": s.next for s in contract.states})
    for key, name in refs.items():
        if name is not None and name not in contract.outputs:
            raise ContractError(f"{key} = {name!r} is not one of the outputs {list(contract.outputs)}")
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
    if contract.noise_shape is not None:
        if contract.noise_kind not in NOISE_KINDS:
            raise ContractError(f"[input] noise_kind must be one of {', '.join(NOISE_KINDS)} when noise is given")
        if a.action is None:
            raise ContractError("a graph that takes noise samples inside: name its sampled output [action] action")
    elif contract.noise_kind is not None:
        raise ContractError("[input] noise_kind without a noise input")
    if a.kind == "distributional":
        if (a.values is None) == (a.logits is None):
            raise ContractError("[action] kind 'distributional' needs exactly one of values = \"<output>\" "
                                "(probabilities over the atoms) or logits = \"<output>\"")  # fmt: skip
        if len(a.atom_values) != a.atoms:
            raise ContractError(f"[action] support must be [v_min, v_max] or {a.atoms} numbers (one per atom), got "
                                f"{len(a.support or ())}")  # fmt: skip
        if np.any(np.diff(a.atom_values) <= 0):
            raise ContractError("[action] support must increase")
    elif a.atoms is not None or a.support is not None:
        raise ContractError(f"[action] atoms and support apply to kind 'distributional' only, not {a.kind!r}")
    inputs = [m.name for m in contract.input_metas()] + [c.name for c in contract.constants]
    if len(set(inputs)) != len(inputs):
        raise ContractError(f"input names repeat a name (observation keys, noise, states): {inputs}")
    shared = sorted(set(inputs) & set(contract.outputs))
    if shared:
        raise ContractError(f"{shared[0]!r} names both an input and an output; give the output another name")


def check_io(contract: ContractParts, outputs: Sequence[Any]) -> None:
    """The graph's actual outputs (``TensorMeta``-like: name, dtype, shape with -1 for the batch) fit the
    roles the contract gives them; ``ContractError`` names the first that does not."""
    if len(outputs) != len(contract.outputs):
        raise ContractError(f"the graph returns {len(outputs)} output(s), the contract names {len(contract.outputs)}")
    meta = {name: out for name, out in zip(contract.outputs, outputs, strict=True)}
    a = contract.action

    def need(name: str | None, what: str, ranks: tuple[int, ...], batched: bool = True) -> tuple[int, ...]:
        shape = tuple(meta[name].shape)  # type: ignore[index]
        if len(shape) not in ranks or (batched and shape[:1] != (-1,)):
            want = " or ".join(f"[batch{', n' * (r - 1)}]" for r in ranks)
            raise ContractError(f"{what} output {name!r} has shape {list(shape)}, expected {want}")
        return shape

    if a.kind in ("argmax", "categorical"):
        role = "values" if a.kind == "argmax" else ("probs" if a.probs else "logits")
        for head in a.heads:
            shape = need(head, f"{a.kind} {role}", (2,))
            if shape[1] < 2:
                raise ContractError(f"{a.kind} output {head!r} has {shape[1]} entries; an index needs >= 2")
    if a.kind == "distributional":
        for head in a.heads:
            shape = need(head, "distributional", (3,))
            if shape[1] < 2 or shape[2] != a.atoms:
                raise ContractError(f"distributional output {head!r} has shape {list(shape)}, expected [batch, "
                                    f"actions >= 2, {a.atoms} atoms]")  # fmt: skip
    width = None
    if a.kind == "gaussian":
        width = need(a.mean, "gaussian mean", (2,))[1]
        for key in ("std", "log_std"):
            spec = getattr(a, key)
            if isinstance(spec, str):
                shape = tuple(meta[spec].shape)
                if shape[-1:] not in ((width,), (1,)) or len(shape) > 2:
                    raise ContractError(f"gaussian {key} output {spec!r} has shape {list(shape)}, expected "
                                        f"[batch, {width}] or a state-independent [{width}]")  # fmt: skip
            elif spec is not None and len(spec) not in (1, width):
                raise ContractError(f"gaussian {key} has {len(spec)} numbers for a {width}-dim action")
    index_ranks = (2,) if a.multi_head else (1,)
    if a.kind == "deterministic":
        shape = need(a.action, "action", index_ranks if a.discrete else (2,))
        width = None if a.discrete else shape[1]
    elif a.action is not None:
        shape = need(a.action, "env action", index_ranks if a.is_discrete else (2,))
        if a.multi_head and shape[1] != len(a.heads):
            raise ContractError(f"env action output {a.action!r} has {shape[1]} columns for {len(a.heads)} heads")
        width = width if a.is_discrete else shape[1]
    if a.low is not None and width is not None and len(a.low) not in (1, width):
        raise ContractError(f"[action] low/high have {len(a.low)} entries for a {width}-dim action")
    for role in ("value", "log_prob"):
        name = getattr(contract, role)
        if name is not None:
            need(name, role, (1, 2))
    for s in contract.states:
        shape = tuple(meta[s.next].shape)
        if shape != (-1, *s.shape):
            raise ContractError(f"[state.{s.name}] next = {s.next!r} has shape {list(shape)}, the state is "
                                f"[batch, {', '.join(map(str, s.shape))}]")  # fmt: skip
    for name in contract.outputs:
        dtype = np.dtype(meta[name].dtype)
        if dtype.kind not in "fiu":
            raise ContractError(f"output {name!r} has dtype {dtype}, expected a number type")
        if dtype.kind != "f" and name != a.action:
            raise ContractError(f"output {name!r} has dtype {dtype}; only a discrete action may be an integer")
