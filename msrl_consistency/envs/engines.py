"""Env engines for training: EnvPool (C++, steps outside the GIL) where it has the env, gymnasium otherwise.

``make_training_envs`` returns an object with the gymnasium 1.x vector-env interface the Trainer uses
(``reset(seed=)``, ``step(actions)`` with SAME_STEP autoreset and ``infos["final_obs"]``, ``get_attr`` /
``set_attr("state_blob")`` for ``resume.state``, ``close``), whichever engine is behind it.

EnvPool resets an env on the step *after* its episode ended (that step's action is ignored, its reward is 0,
``info["elapsed_step"]`` is 0). ``EnvPoolVectorEnv`` does not let that step happen: right after a step on which
some envs ended it resets exactly those envs (EnvPool's sync pools accept a subset of env ids), so the Trainer
sees gymnasium's SAME_STEP stream: the done step carries the true final observation (for the truncation
bootstrap) and the reset observation, and no action or transition is lost. GAE, bootstrap and episode statistics
are therefore computed by the same code, from the same kind of stream, as with gymnasium.

EnvPool's env state cannot be read out, but it is a pure function of the env's seed, how many times it was reset
and the actions of its current episode (no env here draws random numbers while stepping). The snapshot records
those; restoring builds a fresh pool and replays them, so ``--resume`` is exact (checked against the recorded
observation; a mismatch is an error, never a silent divergence).

Verification, ``inference.play`` and evaluation always use gymnasium (the deploy side's env): EnvPool is a training
engine only.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import pickle
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from inference.errors import UsageError

BACKENDS = ("auto", "envpool", "gymnasium")
# EnvPool families whose envs are ports of gymnasium's (same ids, dynamics, time limits); dm_control, Atari and
# the others are not gymnasium ids with the same semantics.
ENVPOOL_FAMILIES = ("envpool.classic_control", "envpool.box2d", "envpool.mujoco.gym")
ENVPOOL_PIN = "envpool==1.2.5"
# ``auto`` picks EnvPool only for ids whose EnvPool port was checked against gymnasium 1.4 (tests/test_env_engines.py,
# bench/engine_agreement.py): one-step observation differences of float32/float64 rounding only (<= 5e-7) for
# classic control and MuJoCo (against gymnasium on mujoco 4.0: <= 1e-6; Hopper's whole random-action episodes agree
# to 5e-15, a trained Hopper policy returns 3,642 vs 3,644 from the same 20 starts); for Box2D, whose terrain comes
# from another RNG, episode statistics and trained-policy returns.
VERIFIED_IDS = {"CartPole-v0": "envpool.classic_control", "CartPole-v1": "envpool.classic_control",
                "Acrobot-v1": "envpool.classic_control", "MountainCar-v0": "envpool.classic_control",
                "MountainCarContinuous-v0": "envpool.classic_control", "BipedalWalker-v3": "envpool.box2d",
                "Hopper-v5": "envpool.mujoco.gym", "Walker2d-v5": "envpool.mujoco.gym",
                "HalfCheetah-v5": "envpool.mujoco.gym"}  # fmt: skip
KNOWN_DIFFERENCES = {
    "Pendulum-v1": "EnvPool's Pendulum-v1 integrates the angle with the unclipped speed (gym <= 0.21), gymnasium 1.x "
    "with the speed clipped to 8 first: trajectories differ whenever the speed clip engages",
}


@dataclass(frozen=True)
class Backend:
    """The engine a run uses and why (recorded in run.json)."""

    name: str  # "envpool" | "gymnasium"
    reason: str
    version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "reason": self.reason, "version": self.version}


def _envpool(families: tuple[str, ...] = ()) -> Any | None:
    """EnvPool with ``families`` registered, or ``None`` if it is not installed.

    ``import envpool`` registers every family it ships and so imports Jumanji's renderer (matplotlib.pyplot),
    MuJoCo Playground, Atari, ...: 0.8 s and ~110 MB of resident memory a training process never uses (measured:
    peak RSS 780 MB instead of 663 MB for a CartPole run). So unless the full package is already imported, the
    package module is created without running its ``__init__``, only the families asked for are imported (classic
    control ~9 MB, Box2D ~3 MB, MuJoCo ~8 MB), and the functions used here are attached to it.
    """
    package = sys.modules.get("envpool")
    if package is None:
        spec = importlib.util.find_spec("envpool")
        if spec is None:
            return None
        package = importlib.util.module_from_spec(spec)
        sys.modules["envpool"] = package
        try:
            registration = importlib.import_module("envpool.registration")
        except ImportError:
            del sys.modules["envpool"]
            return None
        package.make_gymnasium, package.registry = registration.make_gymnasium, registration.registry
        package.__version__ = importlib.metadata.version("envpool")
    if not hasattr(package, "list_all_envs"):  # our partial package: register what is asked for
        for name in families:
            importlib.import_module(f"{name}.registration")
    return package


def envpool_support(env_id: str) -> str | None:
    """``None`` if EnvPool can run ``env_id`` as gymnasium does, else why not (one phrase)."""
    envpool = _envpool((VERIFIED_IDS[env_id],) if env_id in VERIFIED_IDS else ENVPOOL_FAMILIES)
    if envpool is None:
        return f"envpool is not installed (pip install {ENVPOOL_PIN})"
    spec = envpool.registry.specs.get(env_id)
    if spec is None:
        return f"EnvPool has no {env_id}"
    if spec[0] not in ENVPOOL_FAMILIES:
        return f"EnvPool's {env_id} ({spec[0]}) is not gymnasium's env"
    try:
        gym_spec = gym.spec(env_id)
    except gym.error.Error:
        return f"gymnasium has no {env_id} to verify and evaluate on"
    limit = spec[2].get("max_episode_steps")
    if gym_spec.max_episode_steps != limit:
        return f"EnvPool's {env_id} time limit {limit} differs from gymnasium's {gym_spec.max_episode_steps}"
    return None


def resolve_backend(env_id: str, requested: str, async_envs: bool = False) -> Backend:
    """``auto``: EnvPool for the ids verified to match gymnasium, else gymnasium; an explicit choice is checked."""
    if requested not in BACKENDS:
        raise UsageError(f"--env-backend must be one of {', '.join(BACKENDS)}, got {requested!r}")
    if requested == "gymnasium":
        return Backend("gymnasium", "requested")
    if async_envs:
        if requested == "envpool":
            raise UsageError("--async-envs is gymnasium's subprocess vector env; it cannot be used with "
                             "--env-backend envpool (EnvPool steps in its own C++ threads)")  # fmt: skip
        return Backend("gymnasium", "--async-envs asks for gymnasium's subprocess envs")
    if requested == "auto" and env_id in KNOWN_DIFFERENCES:
        return Backend("gymnasium", f"auto: {KNOWN_DIFFERENCES[env_id]}")
    if requested == "auto" and env_id not in VERIFIED_IDS:  # decided without importing EnvPool at all
        return Backend("gymnasium", f"auto: {env_id} is not among the ids whose EnvPool port was verified against "
                       "gymnasium (--env-backend envpool uses EnvPool where it has the id)")  # fmt: skip
    why_not = envpool_support(env_id)
    if why_not is not None:
        if requested == "envpool":
            raise UsageError(f"--env-backend envpool: {why_not}")
        return Backend("gymnasium", f"auto: {why_not}")
    version = _envpool().__version__
    if requested == "envpool":
        caveat = KNOWN_DIFFERENCES.get(env_id) or (
            None if env_id in VERIFIED_IDS else "not verified against gymnasium's dynamics"
        )
        return Backend("envpool", "requested" + (f"; note: {caveat}" if caveat else ""), version)
    return Backend("envpool", "auto: EnvPool runs it with gymnasium's dynamics (verified)", version)


def usable_cpus() -> int:
    """The cores this process may run on (a taskset or container's CPU set), not the machine's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_env_threads(env_id: str, num_envs: int) -> int:
    """Classic-control steps cost ~1 µs: threads only add hand-offs (measured: CartPole x64 66 µs with one thread,
    85 µs with two). Box2D and MuJoCo steps are worth spreading over the cores."""
    if _envpool().registry.specs[env_id][0] == "envpool.classic_control":
        return 1
    return max(1, min(num_envs, usable_cpus()))


@contextlib.contextmanager
def _quiet_space_casts() -> Iterator[None]:
    """EnvPool builds float32 Boxes from float64 bounds (space queries, reset); gymnasium warns of the cast."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*precision lowered by casting to float32")
        yield


class EnvPoolVectorEnv:
    """An EnvPool sync pool behind the gymnasium SAME_STEP vector-env interface (see the module docstring)."""

    def __init__(self, env_id: str, num_envs: int, num_threads: int = 0) -> None:
        self.env_id, self.num_envs = env_id, num_envs
        why_not = envpool_support(env_id)  # also registers the id's family
        if why_not is not None:
            raise UsageError(f"EnvPool cannot run {env_id}: {why_not}")
        self.num_threads = num_threads or default_env_threads(env_id, num_envs)
        self._pool: Any = None
        self._seed: int | None = None
        probe = self._make(0, 1)
        with _quiet_space_casts():
            self.single_observation_space = probe.observation_space
            self.single_action_space = probe.action_space
        self.max_episode_steps = int(probe.config["max_episode_steps"])
        probe.close()
        self.discrete = isinstance(self.single_action_space, gym.spaces.Discrete)
        self._act_dtype = np.int32 if self.discrete else np.float32
        act_shape = () if self.discrete else self.single_action_space.shape
        # Actions of every env's current episode (row = step within the episode) and its reset count: its state.
        self._episode_actions = np.zeros((self.max_episode_steps, num_envs, *act_shape), self._act_dtype)
        self._episode_len = np.zeros(num_envs, np.int64)
        self._resets = np.zeros(num_envs, np.int64)
        self._all = np.arange(num_envs)
        self._obs: np.ndarray | None = None

    def _make(self, seed: int, num_envs: int) -> Any:
        return _envpool().make_gymnasium(self.env_id, num_envs=num_envs, seed=seed, num_threads=self.num_threads)

    # -- the gymnasium vector-env interface --------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """A new pool: env i is seeded with ``seed + i`` (as gymnasium's ``reset(seed=seed)``)."""
        if self._pool is not None:
            self._pool.close()
        self._seed = int(seed) if seed is not None else int(np.random.SeedSequence().entropy % 2**31)
        self._pool = self._make(self._seed, self.num_envs)
        with _quiet_space_casts():
            obs, info = self._pool.reset()
        self._episode_len[:] = 0
        self._resets[:] = 1
        order = self._order(info)
        self._obs = obs if order is None else obs[order]
        return self._obs, {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        actions = np.asarray(actions, self._act_dtype)
        self._episode_actions[self._episode_len, self._all] = actions
        self._episode_len += 1
        return self._finish(self._pool.step(actions))

    def _finish(self, result: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """EnvPool's step result as gymnasium's SAME_STEP one: envs that ended are reset now."""
        obs, reward, terminated, truncated, info = result
        order = self._order(info)
        if order is not None:
            obs, reward, terminated, truncated = obs[order], reward[order], terminated[order], truncated[order]
        done = terminated | truncated
        infos: dict[str, Any] = {}
        if done.any():
            ended = np.flatnonzero(done)
            infos["final_obs"] = obs.copy()  # rows of the envs that ended hold their true final observation
            infos["_final_obs"] = done
            reset_obs, reset_info = self._pool.reset(ended.astype(np.int32))
            obs = obs.copy()
            obs[reset_info["env_id"]] = reset_obs
            self._episode_len[ended] = 0
            self._resets[ended] += 1
        self._obs = obs
        return obs, reward, terminated, truncated, infos

    def get_attr(self, name: str) -> list[Any]:
        if name != "state_blob":
            raise AttributeError(name)
        return [self._state_blob(i) for i in range(self.num_envs)]

    def set_attr(self, name: str, values: list[Any]) -> None:
        if name != "state_blob":
            raise AttributeError(name)
        self._restore([pickle.loads(v) for v in values])

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    # -- snapshot and replay ------------------------------------------------------------------------------------
    def _state_blob(self, i: int) -> bytes:
        return pickle.dumps(
            {"engine": "envpool", "env_id": self.env_id, "seed": self._seed, "index": i, "resets": int(self._resets[i]),
             "actions": self._episode_actions[: self._episode_len[i], i].copy(), "obs": self._obs[i].copy()}
        )  # fmt: skip

    def _restore(self, blobs: list[dict[str, Any]]) -> None:
        """Rebuild the pool with the run's seed, reset each env as often as it was, replay its current episode."""
        ours = all(isinstance(b, dict) and b.get("engine") == "envpool" and b["env_id"] == self.env_id for b in blobs)
        seeds = {b["seed"] for b in blobs} if ours else set()
        if not ours or len(blobs) != self.num_envs or len(seeds) != 1:
            raise UsageError("resume state: the EnvPool snapshot does not match this run's envs")
        self.reset(seed=seeds.pop())
        resets = np.array([b["resets"] for b in blobs])
        for k in range(2, int(resets.max()) + 1):  # a reset draws from the env's own generator, nothing else does
            self._pool.reset(np.flatnonzero(resets >= k).astype(np.int32))
        lengths = np.array([len(b["actions"]) for b in blobs])
        obs = self._obs.copy()
        for t in range(int(lengths.max(initial=0))):
            ids = np.flatnonzero(lengths > t)
            acts = np.stack([blobs[i]["actions"][t] for i in ids])
            step_obs, _, terminated, truncated, info = self._pool.step(acts, ids.astype(np.int32))
            if (terminated | truncated).any():
                raise RuntimeError("EnvPool replay ended an episode that was running at the checkpoint")
            obs[info["env_id"]] = step_obs
        for i, blob in enumerate(blobs):
            self._episode_actions[: lengths[i], i] = blob["actions"]
        self._episode_len[:], self._resets[:] = lengths, resets
        expected = np.stack([b["obs"] for b in blobs])
        if not np.array_equal(obs, expected):
            raise RuntimeError("EnvPool replay did not reproduce the checkpointed observations; cannot resume exactly")
        self._obs = obs

    @staticmethod
    def _order(info: dict[str, Any]) -> np.ndarray | None:
        """``None`` when rows come in env-id order (a sync pool returns them so), else the rows to take."""
        ids = info["env_id"]
        if ids[0] == 0 and np.all(ids[1:] > ids[:-1]):
            return None
        return np.argsort(ids)


def gymnasium_env_workers(env_id: str, num_envs: int, world_size: int = 1) -> int:
    """Processes to step gymnasium's envs (``--env-threads 0``): one per core (the ranks share the cores) for
    gymnasium's own Box2D and MuJoCo envs, 1 (this process alone) for everything else. A classic-control step
    (~10 µs) costs less than a pipe round trip, and users' own envs may be registered in their process only."""
    try:
        entry = str(gym.spec(env_id).entry_point)
    except gym.error.Error:
        return 1
    if not entry.startswith(("gymnasium.envs.box2d", "gymnasium.envs.mujoco")):
        return 1
    return max(1, min(num_envs, usable_cpus() // max(1, world_size)))


def make_training_envs(env_id: str, num_envs: int, backend: str, async_envs: bool = False,
                       env_threads: int = 0, world_size: int = 1) -> Any:  # fmt: skip
    """The vector env the Trainer steps: ``backend`` is a resolved name (``resolve_backend``)."""
    if backend == "envpool":
        return EnvPoolVectorEnv(env_id, num_envs, env_threads)
    from msrl_consistency.envs.make import make_vector_env

    workers = env_threads or gymnasium_env_workers(env_id, num_envs, world_size)
    if async_envs or workers == 1:
        return make_vector_env(env_id, num_envs, async_envs)
    from msrl_consistency.envs.sharded import ShardedVectorEnv

    return ShardedVectorEnv(env_id, num_envs, workers)
