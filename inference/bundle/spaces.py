"""Does a policy contract describe an env's spaces? Checked before any episode runs (verify, play, check).

A contract that describes less than the env is refused, not passed: an env whose observations or actions the
contract cannot express (a ``Dict`` observation, a ``MultiDiscrete`` action with one head in the contract...)
would otherwise be fed a float array it never produces or given one index where it needs several.
Gymnasium is imported lazily: reading a bundle never needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from inference.bundle.contract import PolicyContract
from inference.errors import UsageError


def check_env_spaces(
    contract: PolicyContract, obs_space: Any, act_space: Any, output_width: Callable[[str], int | None], where: str,
    output_shape: Callable[[str], tuple[int, ...]] | None = None,
) -> None:  # fmt: skip
    """``UsageError`` (one line, naming the space) unless ``contract`` describes both spaces.

    ``output_width(name)`` is the last dimension of a contract output (the number of scores of a discrete head);
    ``output_shape(name)`` its whole shape, which a distributional head (``[batch, actions, atoms]``) needs to be
    checked against the env's actions (without it, that head's action count is not checked).
    """
    if contract.action.kind == "distributional":
        shape_of = output_shape
        output_width = (lambda name: shape_of(name)[-2]) if shape_of is not None else (lambda name: None)
    _check_observations(contract, obs_space, where)
    import gymnasium as gym

    a = contract.action
    if isinstance(act_space, gym.spaces.MultiDiscrete):
        nvec = [int(n) for n in np.asarray(act_space.nvec).ravel()]
        if not a.is_discrete or len(a.heads) != len(nvec) or a.kind == "deterministic":
            raise UsageError(f"{where}: the env acts in {_name(act_space)}, {len(nvec)} heads; the contract's "
                             f"{a.kind} action has {len(a.heads) if a.is_discrete else 'no index'} head(s): name one "
                             "output per head (e.g. logits = [\"a\", \"b\"])")  # fmt: skip
        widths = [output_width(h) for h in a.heads]
        if None not in widths and widths != nvec:
            raise UsageError(f"{where}: the env's heads take {nvec} actions, the contract's heads "
                             f"{list(a.heads)} have {widths}")  # fmt: skip
        if np.any(np.asarray(getattr(act_space, "start", 0)) != 0):
            raise UsageError(f"{where}: the env's actions do not start at 0; a contract's indices do")
    elif isinstance(act_space, gym.spaces.Discrete):
        if not a.is_discrete:
            raise UsageError(f"{where}: the env takes a discrete action, the contract's {a.kind} action is not")
        if a.multi_head:
            raise UsageError(f"{where}: the env takes one index ({_name(act_space)}), the contract has "
                             f"{len(a.heads)} heads")  # fmt: skip
        width = output_width(a.distribution_output) if a.kind != "deterministic" else None
        if width is not None and width != act_space.n:
            raise UsageError(f"{where}: the env has {act_space.n} actions, output {a.distribution_output!r} "
                             f"has {width}")  # fmt: skip
        if int(act_space.start) != 0:
            raise UsageError(f"{where}: the env's actions start at {int(act_space.start)}; a contract's index starts "
                             "at 0")  # fmt: skip
    elif isinstance(act_space, gym.spaces.Box):
        if a.is_discrete:
            raise UsageError(f"{where}: the env takes a continuous action, the contract's action is an index")
        if a.low is not None and a.high is not None:
            low = np.broadcast_to(np.asarray(a.low, np.float64), act_space.shape)
            high = np.broadcast_to(np.asarray(a.high, np.float64), act_space.shape)
            if not (np.allclose(low, act_space.low) and np.allclose(high, act_space.high)):
                raise UsageError(f"{where}: the contract's action bounds (low {list(a.low)}, high {list(a.high)}) "
                                 f"are not the env's (low {act_space.low.tolist()}, high "
                                 f"{act_space.high.tolist()})")  # fmt: skip
    else:
        raise UsageError(
            f"{where}: the env acts in {_name(act_space)}; a contract describes index heads "
            "(Discrete, MultiDiscrete) or a Box action: this env cannot be verified with it"
        )


def _check_observations(contract: PolicyContract, space: Any, where: str) -> None:
    """An array observation is a ``Box`` of the contract's shape; a ``Dict`` observation has exactly the contract's
    keys, each a ``Box`` of its shape. An integer input (uint8 frames) needs an integer ``Box``."""
    import gymnasium as gym

    if contract.obs_dict:
        if not isinstance(space, gym.spaces.Dict):
            raise UsageError(f"{where}: the env observes {_name(space)}, the contract a Dict of "
                             f"{[f.name for f in contract.observations]}")  # fmt: skip
        keys, declared = list(space.spaces), [f.name for f in contract.observations]
        missing, extra = [k for k in keys if k not in declared], [k for k in declared if k not in keys]
        if missing or extra:
            raise UsageError(f"{where}: the env's Dict observation has keys {keys}, the contract {declared}"
                             + (f" (the contract leaves out {missing})" if missing else ""))  # fmt: skip
        for f in contract.observations:
            _check_box(f.name, f.shape, f.dtype, space.spaces[f.name], where)
        return
    field = contract.observations[0]
    if isinstance(space, gym.spaces.Discrete):
        if field.discrete is None:
            raise UsageError(f"{where}: the env observes {_name(space)}, one index; the contract declares an array "
                             f"observation {list(field.shape)}: declare [input] discrete = {int(space.n)} (int32 "
                             "indices, e.g. for an Embedding)")  # fmt: skip
        if field.discrete != int(space.n) or int(space.start) != 0 or field.shape:
            raise UsageError(f"{where}: the env observes {_name(space)}, the contract discrete = {field.discrete}"
                             f"{f' of shape {list(field.shape)}' if field.shape else ''} (indices 0..N-1, one per "
                             "step)")  # fmt: skip
        return
    if field.discrete is not None:
        raise UsageError(f"{where}: the env observes {_name(space)}, the contract a Discrete({field.discrete}) "
                         "index ([input] discrete)")  # fmt: skip
    if isinstance(space, gym.spaces.Dict):
        raise UsageError(f"{where}: the env observes {_name(space)}; the contract declares one array observation "
                         f"{list(contract.obs_shape)}: declare [input.obs] keys for a Dict observation")  # fmt: skip
    if not isinstance(space, gym.spaces.Box):
        raise UsageError(f"{where}: the env observes {_name(space)}; a contract describes a Box (an array), a "
                         "Discrete (one index: [input] discrete = N) or a Dict of them")  # fmt: skip
    _check_box("obs", field.shape, field.dtype, space, where)


def _check_box(name: str, shape: tuple[int, ...], dtype: str, space: Any, where: str) -> None:
    import gymnasium as gym

    if not isinstance(space, gym.spaces.Box):
        raise UsageError(f"{where}: observation {name!r} is {_name(space)}, the contract says an array")
    if space.shape is not None and tuple(space.shape) != shape:
        raise UsageError(f"{where}: observation {name!r} is {list(space.shape)}, the contract says {list(shape)}")
    if np.dtype(dtype).kind in "iu" and np.dtype(space.dtype).kind == "f":
        raise UsageError(f"{where}: observation {name!r} is {space.dtype}, the contract says {dtype}")


def _name(space: Any) -> str:
    """A space as one short phrase: ``Dict('img': Box(...), 'vec': Box(...))`` shortened, ``MultiDiscrete([3 2])``."""
    text = " ".join(str(space).split())
    return text if len(text) <= 120 else text[:117] + "..."
