"""Create single and vector Gymnasium environments, validating their spaces up front.

No observation or action wrappers are applied on purpose: normalisation, clipping and action
scaling live inside the policy graph so that export carries them.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from inference.errors import UsageError

# Importing registers the tiny test environments with Gymnasium.
from msrl_consistency.envs import toy  # noqa: F401  isort: skip


@dataclass(frozen=True)
class EnvInfo:
    """What the policy needs to know about an environment: ids, shapes, bounds."""

    env_id: str
    obs_dim: int
    obs_low: list[float]
    obs_high: list[float]
    action_kind: str  # "discrete" | "box"
    action_dim: int  # number of actions (discrete) or action dimensions (box)
    action_low: list[float]
    action_high: list[float]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EnvInfo:
        return cls(**data)


def _make_raw(env_id: str, **kwargs: Any) -> gym.Env:
    from inference.compare.episodes import registered_env_id

    env_id = registered_env_id(env_id)[0] or env_id  # a deprecated version runs as its registered successor
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.NameNotFound:
        raise UsageError(f"unknown environment id {env_id!r}") from None
    except gym.error.Error as exc:
        raise UsageError(f"cannot create environment {env_id!r}: {exc}") from None
    except (ImportError, ModuleNotFoundError, gym.error.DependencyNotInstalled) as exc:
        raise UsageError(f"environment {env_id!r} needs an extra dependency: {exc}") from None


def _finite(values: np.ndarray) -> list[float]:
    return [float(v) for v in np.nan_to_num(values.astype(np.float64), posinf=np.inf, neginf=-np.inf)]


def describe_env(env_id: str) -> EnvInfo:
    """Check the spaces are supported (Box obs; Discrete or Box actions) and describe them."""
    env = _make_raw(env_id)
    try:
        obs_space, act_space = env.observation_space, env.action_space
    finally:
        env.close()
    if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
        raise UsageError(f"{env_id}: unsupported observation space {obs_space} (need a 1-D Box)")
    if isinstance(act_space, gym.spaces.Discrete):
        kind, dim = "discrete", int(act_space.n)
        low, high = [0.0], [float(act_space.n - 1)]
    elif isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1:
        if not (np.all(np.isfinite(act_space.low)) and np.all(np.isfinite(act_space.high))):
            raise UsageError(f"{env_id}: Box action space must be bounded, got {act_space}")
        kind, dim = "box", int(act_space.shape[0])
        low, high = _finite(act_space.low), _finite(act_space.high)
    else:
        raise UsageError(f"{env_id}: unsupported action space {act_space} (need Discrete or a 1-D Box)")
    return EnvInfo(
        env_id=env_id,
        obs_dim=int(obs_space.shape[0]),
        obs_low=_finite(obs_space.low),
        obs_high=_finite(obs_space.high),
        action_kind=kind,
        action_dim=dim,
        action_low=low,
        action_high=high,
    )


class Snapshot(gym.Wrapper):
    """Expose the wrapped env's full state as a picklable blob, so ``--resume`` continues bitwise.

    Works for pure-Python/NumPy envs (classic control). Envs holding C handles (Box2D, MuJoCo) cannot
    be pickled: ``state_blob`` is then ``None`` and resume restarts their episodes.
    """

    @property
    def state_blob(self) -> bytes | None:
        if isinstance(self.env.unwrapped, gym.utils.EzPickle):
            # EzPickle (Box2D, MuJoCo) pickles the constructor arguments, not the state: it would "restore" a fresh,
            # un-reset env (BipedalWalker then fails its first step). Not snapshottable.
            return None
        try:
            return pickle.dumps(self.env)
        except Exception:  # noqa: BLE001 - any pickling failure means "not snapshottable"
            return None

    @state_blob.setter
    def state_blob(self, blob: bytes) -> None:
        self.env = pickle.loads(blob)


def make_env(env_id: str, **kwargs: Any) -> gym.Env:
    return Snapshot(_make_raw(env_id, **kwargs))


def make_vector_env(env_id: str, num_envs: int, async_envs: bool = False) -> gym.vector.VectorEnv:
    """Vector env with SAME_STEP autoreset: a done step returns the reset obs and ``final_obs`` in infos."""
    fns = [lambda: make_env(env_id) for _ in range(num_envs)]
    mode = gym.vector.AutoresetMode.SAME_STEP
    if async_envs:
        return gym.vector.AsyncVectorEnv(fns, autoreset_mode=mode, context="spawn")
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=mode)
