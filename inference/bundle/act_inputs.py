"""What a caller may hand ``Policy.act``, checked against the policy contract: never cast, refused in one line.

An array passed with another dtype than the contract's is a ``FeedError`` that names the input, both dtypes and
the values' range, with the conversion that was probably forgotten: a float frame for a uint8 input is a frame
already divided by 255 (the graph divides it itself), so casting it would act on an almost black image; int64
indices cast to int32 wrap. Only values without a dtype of their own (Python numbers and lists of them) are
converted, and only when every value survives the conversion exactly (integers in range for an integer input).

Accepted observations, for an array observation of shape ``S``: one observation (``S``) or a batch (``[n, *S]``);
for a ``Dict`` observation: one dict of arrays, a batch in Gymnasium's vector-env layout (a dict of ``[n, ...]``
arrays), a list of dicts, or rows of the contract's structured ``obs_dtype``. Missing and extra keys are refused.
A ``Discrete(N)`` observation is one index or a batch of them: a Python int, or integers of any integer dtype
(Gymnasium's ``Discrete`` spaces hand out int64), converted only once every index is known to lie in ``0..N-1``
(so exactly); one outside is refused rather than fed to an Embedding table it overruns.
The arrays returned are the caller's own (views, never copies), so what is fed and recorded is what was passed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from inference.bundle.contract import Field, PolicyContract
from inference.bundle.tensors import FeedError


def observation_inputs(contract: PolicyContract, obs: Any) -> tuple[list[np.ndarray], bool]:
    """The graph's observation inputs for ``obs`` (one array per contract field, batch first), and whether ``obs``
    was a single observation rather than a batch."""
    if not contract.obs_dict:
        field = contract.observations[0]
        array = _index_input(obs, field) if field.discrete is not None else _as_input(obs, field, "observation")
        return _batched(array, field, "observation")
    if isinstance(obs, np.ndarray) and obs.dtype.names is not None:  # rows of the contract's structured dtype
        if obs.dtype != contract.obs_dtype or obs.ndim != 1:
            raise FeedError(f"observation rows have dtype {obs.dtype} and shape {obs.shape}; the policy takes rows of "
                            f"{contract.obs_dtype}")  # fmt: skip
        return [obs[f.name] for f in contract.observations], False
    if isinstance(obs, Sequence) and not isinstance(obs, str | bytes) and obs and isinstance(obs[0], Mapping):
        arrays = [_dict_inputs(contract, row, f"observation {k}") for k, row in enumerate(obs)]
        if any(single is False for _, single in arrays):
            raise FeedError("a list of Dict observations holds one observation per entry, not batches")
        return [np.concatenate([a[i] for a, _ in arrays]) for i in range(len(contract.observations))], False
    if not isinstance(obs, Mapping):
        keys = ", ".join(repr(f.name) for f in contract.observations)
        raise FeedError(f"the policy observes a Dict ({keys}); got {type(obs).__name__}")
    return _dict_inputs(contract, obs, "observation")


def _dict_inputs(contract: PolicyContract, obs: Mapping[str, Any], where: str) -> tuple[list[np.ndarray], bool]:
    """One Dict observation or a vector env's batch of them: its arrays in the contract's key order, batch first
    (a single observation as a batch of one), and whether it was a single observation."""
    declared = [f.name for f in contract.observations]
    missing = [k for k in declared if k not in obs]
    if missing:
        raise FeedError(f"{where} lacks key(s) {', '.join(map(repr, missing))}; the policy takes "
                        f"{', '.join(map(repr, declared))}")  # fmt: skip
    extra = [k for k in obs if k not in declared]
    if extra:
        raise FeedError(f"{where} has key(s) {', '.join(map(repr, extra))} the policy does not take (it takes "
                        f"{', '.join(map(repr, declared))}): leave them out explicitly")  # fmt: skip
    arrays = [_as_input(obs[f.name], f, f"{where} {f.name!r}") for f in contract.observations]
    singles = [a.ndim == len(f.shape) for a, f in zip(arrays, contract.observations, strict=True)]
    batched = [_batched(a, f, f"{where} {f.name!r}")[0][0] for a, f in zip(arrays, contract.observations, strict=True)]
    if all(singles):
        return batched, True
    if any(singles):
        one = contract.observations[singles.index(True)].name
        many = contract.observations[singles.index(False)].name
        raise FeedError(f"{where}: key {one!r} holds one observation and key {many!r} a batch")
    rows = {len(a) for a in batched}
    if len(rows) > 1:
        sizes = ", ".join(f"{f.name!r}: {len(a)}" for f, a in zip(contract.observations, batched, strict=True))
        raise FeedError(f"{where}: the keys hold different numbers of rows ({sizes})")
    return batched, False


def _index_input(value: Any, field: Field) -> np.ndarray:
    """Indices of a ``Discrete(N)`` observation: any integers, all in ``0..N-1``, as the contract's dtype."""
    given = np.asarray(value) if hasattr(value, "dtype") else None
    integers = given is not None and given.dtype.kind in "iu"
    array = given if integers else _as_input(value, field, "observation")  # Python ints; a float array is refused
    n = field.discrete or 0
    if array.size and (array.min() < 0 or array.max() >= n):
        bad = array.min() if array.min() < 0 else array.max()
        raise FeedError(f"observation index {bad} is outside the policy's Discrete({n}) observations (0..{n - 1})")
    return array if array.dtype == np.dtype(field.dtype) else array.astype(field.dtype)


def _batched(array: np.ndarray, field: Field, where: str) -> tuple[list[np.ndarray], bool]:
    """``array`` as a batch of ``field`` rows (a single observation gets a batch dimension, as a view)."""
    shape = tuple(field.shape)
    if array.ndim == len(shape) and array.shape == shape:
        return [array[None]], True
    if array.ndim == len(shape) + 1 and array.shape[1:] == shape and len(array):
        return [array], False
    want = f"{list(shape)} (one observation) or [n, {', '.join(map(str, shape))}]".replace("[n, ]", "[n]")
    raise FeedError(f"{where} has shape {list(array.shape)}; the policy takes {want}")


def _as_input(value: Any, field: Field, where: str) -> np.ndarray:
    """``value`` as an array of the field's dtype: an array (or anything with a dtype) must already have it; Python
    numbers are converted when every value is representable exactly."""
    want = np.dtype(field.dtype)
    if isinstance(value, np.ndarray | np.generic) or hasattr(value, "dtype"):
        array = np.asarray(value)
        if array.dtype != want:
            raise FeedError(wrong_dtype(where, array, want))
        return array
    try:
        array = np.asarray(value)
    except ValueError as exc:  # ragged lists
        raise FeedError(f"{where}: {exc}") from None
    if array.dtype == want:
        return array
    if array.dtype.kind not in "biuf":
        raise FeedError(f"{where}: expected numbers ({want}), got {type(value).__name__} of {array.dtype}")
    return _exact(array, want, where)


def _exact(values: np.ndarray, want: np.dtype, where: str) -> np.ndarray:
    """Python numbers converted to ``want`` where nothing is lost: integers in range, whole numbers for an integer
    input; finite floats within the float input's range (a Python float carries no precision of its own to lose, but
    1e300 in float32 is inf: that is refused)."""
    if want.kind == "f":
        with np.errstate(over="ignore"):
            cast = values.astype(want)
        if (np.isfinite(cast) | ~np.isfinite(values)).all():  # inf and NaN given stay as given: only overflow refused
            return cast
        raise FeedError(
            f"{where}: Python numbers{_span(values)} given, beyond {want}'s range (±"
            f"{float(np.finfo(want).max):.4g}): they would become inf"
        )
    if want.kind in "iu":
        info = np.iinfo(want)
        finite = np.isfinite(values) if values.dtype.kind == "f" else np.ones(values.shape, bool)
        whole = finite.all() and (values.dtype.kind != "f" or bool((values == np.round(values)).all()))
        if whole and (values.size == 0 or (values.min() >= info.min and values.max() <= info.max)):
            return values.astype(want)
    if want.kind == "b" and values.dtype.kind == "b":
        return values.astype(want)
    raise FeedError(wrong_dtype(where, values, want, python=True))


def wrong_dtype(where: str, array: np.ndarray, want: np.dtype, python: bool = False) -> str:
    """One line: what was given (dtype and value range), what the policy takes, and the likely fix."""
    given = "Python numbers" if python else str(array.dtype)
    span = _span(array)
    line = f"{where}: {given}{span} given, the policy takes {want}"
    if want == np.uint8 and array.dtype.kind == "f":
        if array.size and np.nanmax(array) <= 1.0:
            return (f"{line} (0-255): the graph divides the frame by 255 itself; pass the env's uint8 frame (these "
                    "values look divided by 255 already; cast, they would be an almost black frame)")  # fmt: skip
        return f"{line} (0-255): pass the env's uint8 frame, not a float copy of it"
    if want.kind in "iu":
        info = np.iinfo(want)
        return f"{line} ({info.min}-{info.max}): convert with .astype(np.{want}) once you know every value fits"
    if want.kind == "f" and array.dtype.kind == "f":
        return f"{line}: convert with .astype(np.{want}) (the policy was exported for {want} inputs)"
    return f"{line}: convert it to {want} where it is produced"


def _span(array: np.ndarray) -> str:
    if array.size == 0 or array.dtype.kind not in "biuf":
        return ""
    with np.errstate(all="ignore"):
        finite = array[np.isfinite(array)] if array.dtype.kind == "f" else array
    if finite.size == 0:
        return " (no finite value)"
    lo, hi = finite.min(), finite.max()
    return f" (values {lo:.6g} to {hi:.6g})"


def float32_input(value: Any, shape: tuple[int, ...], rows: int, where: str) -> np.ndarray:
    """Noise the caller passes: float32 ``[rows, *shape]`` (or one row of ``shape`` for a single observation)."""
    array = _as_input(value, Field(where, shape, "float32"), where)
    if array.shape == shape and rows == 1:
        return array[None]
    if array.shape != (rows, *shape):
        raise FeedError(f"{where} has shape {list(array.shape)}; this call needs [{rows}, "
                        f"{', '.join(map(str, shape))}]")  # fmt: skip
    return array
