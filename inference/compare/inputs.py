"""Inputs of a check: where observations come from, independent of the policy and of the runtimes.

An env (a registered gymnasium id, or a team's own constructor given as ``MODULE:FACTORY``) to play seeded
episodes in, or observations the team recorded (``.npy``/``.npz``). MindSpore-free: the deploy side's golden
check resolves its inputs here too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle import Bundle
from inference.compare.episodes import EnvSource, gym_env_source
from inference.contract import PolicyContract
from inference.errors import UsageError, first_line
from inference.plugins import import_factory


@dataclass
class Inputs:
    """Where observations come from: an env to play seeded episodes in, or recorded observations."""

    env: EnvSource | None = None
    recorded: np.ndarray | None = None
    recorded_from: str | None = None

    def describe(self) -> dict[str, str | None]:
        return {
            "env": self.env.label if self.env else None,
            "recorded_observations": None if self.recorded is None else f"{self.recorded_from} ({len(self.recorded)})",
        }

    @property
    def label(self) -> str:
        """What the observations are, in a few words: the env, or the recorded file."""
        if self.env is not None:
            return self.env.label
        if self.recorded is not None:
            return f"recorded observations {self.recorded_from}"
        return "the golden file's observations"


def check_same_contract(bundle: Bundle, given: PolicyContract) -> None:
    """A contract passed with a bundle must be the one the bundle recorded (its env id aside)."""
    recorded = bundle.contract(bundle.graphs[0])
    if given.to_dict() != recorded.with_env(given.env_id).to_dict():
        raise UsageError(f"--contract differs from the contract recorded in {bundle.root}/manifest.json")


def resolve_inputs(
    bundle: Bundle,
    env_id: str | None = None,
    env: str | Callable[[], Any] | None = None,
    observations: str | Path | np.ndarray | None = None,
) -> Inputs:
    """The observation source: recorded observations, or an env (given, or the one the bundle names)."""
    if sum(x is not None for x in (env_id, env, observations)) > 1:
        raise UsageError("give one observation source: --env-id, --env or --observations-file")
    if observations is not None:
        label = "array" if isinstance(observations, np.ndarray) else str(observations)
        return Inputs(recorded=load_observations(observations, bundle), recorded_from=label)
    if env is not None:
        return Inputs(env=env_factory_source(env))
    env_id = env_id or bundle.env_id
    if env_id is None:
        raise UsageError("no observation source: the bundle names no env; pass --env-id, --env or --observations-file")
    return Inputs(env=env_source(env_id))


def env_source(env_id: str) -> EnvSource:
    import gymnasium as gym

    with contextlib.suppress(ImportError):  # the training package, where installed, registers its tiny test envs
        import msrl_consistency.envs  # noqa: F401

    try:
        return gym_env_source(env_id)
    except gym.error.Error as exc:
        raise UsageError(f"unknown environment id {env_id!r} ({first_line(exc)})") from None


def env_factory_source(env: str | Callable[[], Any]) -> EnvSource:
    """A team's own env constructor (``MODULE:FACTORY`` or a callable) as an episode source."""
    factory = import_factory(env, "--env") if isinstance(env, str) else env
    label = env if isinstance(env, str) else getattr(env, "__name__", "env")
    try:
        probe = factory()
    except Exception as exc:  # noqa: BLE001 - the user's constructor may raise anything
        raise UsageError(f"--env {label}: constructing the env failed: {first_line(exc)}") from None
    try:
        spec = getattr(probe, "spec", None)
        steps = getattr(spec, "max_episode_steps", None) or 1000
    finally:
        probe.close()
    return EnvSource(str(label), factory, int(steps))


def load_observations(source: str | Path | np.ndarray, bundle: Bundle) -> np.ndarray:
    """Recorded observations ``[N, *obs_shape]`` from an array, ``.npy`` or ``.npz`` (key ``obs`` or its only array)."""
    shape = bundle.contract(bundle.graphs[0]).obs_shape
    if isinstance(source, np.ndarray):
        data, where = source, "observations"
    else:
        path = Path(source)
        if not path.is_file():
            raise UsageError(f"observations file not found: {path}")
        try:
            loaded = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise UsageError(f"{path} is not a .npy/.npz file ({first_line(exc)})") from None
        if isinstance(loaded, np.lib.npyio.NpzFile):
            with loaded:
                keys = loaded.files
                key = "obs" if "obs" in keys else (keys[0] if len(keys) == 1 else None)
                if key is None:
                    raise UsageError(f"{path}: an .npz needs an 'obs' array or exactly one array (has {keys})")
                try:
                    data = loaded[key]
                except ValueError as exc:  # an object array: never unpickled
                    why = first_line(exc)
                    raise UsageError(f"{path}: array {key!r} holds Python objects, not numbers ({why})") from None
        else:
            data = loaded
        where = str(path)
    data = np.asarray(data)
    if data.ndim != len(shape) + 1 or tuple(data.shape[1:]) != shape or data.dtype.kind not in "fiu":
        raise UsageError(f"{where}: expected numbers shaped [N, {', '.join(map(str, shape))}], got "
                         f"{data.dtype}{list(data.shape)}")  # fmt: skip
    if not len(data):
        raise UsageError(f"{where} holds no observations")
    return data.astype(np.float32)
