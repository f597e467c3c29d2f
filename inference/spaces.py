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

from inference.contract import PolicyContract
from inference.errors import UsageError


def check_env_spaces(
    contract: PolicyContract, obs_space: Any, act_space: Any, output_width: Callable[[str], int | None], where: str
) -> None:
    """``UsageError`` (one line, naming the space) unless ``contract`` describes both spaces.

    ``output_width(name)`` is the last dimension of a contract output (the number of scores of a discrete head).
    """
    import gymnasium as gym

    if not isinstance(obs_space, gym.spaces.Box):
        raise UsageError(f"{where}: the env observes {_name(obs_space)}; a contract describes one array observation "
                         "([input] obs), so this env cannot be verified with it")  # fmt: skip
    if obs_space.shape is not None and tuple(obs_space.shape) != contract.obs_shape:
        raise UsageError(f"{where}: observations are {list(obs_space.shape)}, the contract says "
                         f"{list(contract.obs_shape)}")  # fmt: skip
    a = contract.action
    if isinstance(act_space, gym.spaces.Discrete):
        if not a.is_discrete:
            raise UsageError(f"{where}: the env takes a discrete action, the contract's {a.kind} action is not")
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
        raise UsageError(f"{where}: the env acts in {_name(act_space)}; a contract describes one action head (an "
                         "index or a Box), so this env cannot be verified with it")  # fmt: skip


def _name(space: Any) -> str:
    """A space as one short phrase: ``Dict('img': Box(...), 'vec': Box(...))`` shortened, ``MultiDiscrete([3 2])``."""
    text = " ".join(str(space).split())
    return text if len(text) <= 120 else text[:117] + "..."
