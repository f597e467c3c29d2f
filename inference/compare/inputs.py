"""Inputs of a check: where observations come from, independent of the policy and of the runtimes.

An env (a registered gymnasium id, or a team's own constructor given as ``MODULE:FACTORY``) to play seeded
episodes in, or observations the team recorded (``.npy``/``.npz``). MindSpore-free: the deploy side's golden
check resolves its inputs here too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle import Bundle
from inference.bundle.contract import OBS, Field, PolicyContract
from inference.compare.episodes import EnvSource, gym_env_source
from inference.compare.plugins import import_factory
from inference.errors import UsageError, first_line


@dataclass
class Inputs:
    """Where observations come from: an env to play seeded episodes in, or recorded observations."""

    env: EnvSource | None = None
    recorded: np.ndarray | None = None  # observation rows (``contract.obs_dtype``)
    recorded_from: str | None = None
    recorded_state: np.ndarray | None = None  # the carried states recorded with them, if any

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
    observations: str | Path | np.ndarray | Mapping[str, np.ndarray] | None = None,
) -> Inputs:
    """The observation source: recorded observations, or an env (given, or the one the bundle names)."""
    if sum(x is not None for x in (env_id, env, observations)) > 1:
        raise UsageError("give one observation source: --env-id, --env or --observations-file")
    if observations is not None:
        label = str(observations) if isinstance(observations, str | Path) else "array"
        obs, state = load_observations(observations, bundle)
        return Inputs(recorded=obs, recorded_from=label, recorded_state=state)
    if env is not None:
        return Inputs(env=env_factory_source(env))
    env_id = env_id or bundle.env_id
    if env_id is None:
        raise UsageError("no observation source: the bundle names no env; pass --env-id, --env or --observations-file")
    return Inputs(env=env_source(env_id))


def env_source(env_id: str) -> EnvSource:
    """An env id from gymnasium's registry (``episodes.gym_env_source``). Envs defined elsewhere are registered there
    by their package before (the training package does so for its tiny test envs); a team's own env is
    ``--env MODULE:FACTORY``."""
    return gym_env_source(env_id)


def env_factory_source(env: str | Callable[[], Any]) -> EnvSource:
    """A team's own env constructor (``MODULE:FACTORY`` or a callable) as an episode source."""
    factory = import_factory(env, "--env") if isinstance(env, str) else env
    label = env if isinstance(env, str) else _factory_label(env)
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


def _factory_label(factory: Callable[[], Any]) -> str:
    """A callable env constructor by the name that imports it again (``MODULE:FACTORY``, what a golden file records
    for the device's ``inference.check``), or its bare name when it has none (a lambda, a local function)."""
    module, name = getattr(factory, "__module__", None), getattr(factory, "__qualname__", None)
    if module and name and "<" not in name and module != "__main__":
        return f"{module}:{name}"
    return getattr(factory, "__name__", "env")


def load_observations(
    source: str | Path | np.ndarray | Mapping[str, np.ndarray], bundle: Bundle
) -> tuple[np.ndarray, np.ndarray | None]:
    """Recorded observation rows (``contract.obs_dtype``) and, for a policy that carries state, the states they
    were recorded with (None: not recorded; the ``init`` is then fed).

    From an array, a mapping of arrays, a ``.npy`` (an array observation) or an ``.npz``: key ``obs`` (or its only
    array) for an array observation, one key per observation key for a ``Dict`` observation, and optionally one
    key per ``[state.NAME]``. Nothing is unpickled.
    """
    contract = bundle.contract(bundle.graphs[0])
    if isinstance(source, np.ndarray | Mapping):
        arrays, where = (dict(source) if isinstance(source, Mapping) else {"obs": source}), "observations"
    else:
        arrays, where = _read_arrays(Path(source)), str(source)
    if not contract.obs_dict and "obs" not in arrays:
        if len(arrays) != 1:
            raise UsageError(f"{where}: an .npz needs an 'obs' array or exactly one array (has {sorted(arrays)})")
        arrays = {"obs": next(iter(arrays.values()))}
    columns = {f.name: _column(arrays, f, where) for f in contract.observations}
    rows = len(next(iter(columns.values())))
    if any(len(c) != rows for c in columns.values()) or not rows:
        raise UsageError(f"{where}: the observation arrays must hold the same, non-zero number of rows")
    obs = contract.empty_observations(rows) if contract.obs_dict else columns[OBS].astype(contract.obs_dtype)
    if contract.obs_dict:
        for name, column in columns.items():
            obs[name] = column
    state = None
    if contract.states and all(s.name in arrays for s in contract.states):
        state = contract.initial_state(rows)
        for s in contract.states:
            state[s.name] = _column(arrays, s, where)  # type: ignore[index]
    return obs, state


def _read_arrays(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise UsageError(f"observations file not found: {path}")
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path} is not a .npy/.npz file ({first_line(exc)})") from None
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        return {"obs": loaded}
    arrays = {}
    with loaded:
        for key in loaded.files:
            try:
                arrays[key] = loaded[key]
            except ValueError as exc:  # an object array: never unpickled
                why = first_line(exc)
                raise UsageError(f"{path}: array {key!r} holds Python objects, not numbers ({why})") from None
    return arrays


def _column(arrays: Mapping[str, np.ndarray], field: Field, where: str) -> np.ndarray:
    """One recorded input: numbers shaped ``[N, *shape]``, castable to its dtype without loss of kind."""
    if field.name not in arrays:
        raise UsageError(f"{where}: no array {field.name!r} (the contract's inputs: {field.name} {list(field.shape)})")
    data = np.asarray(arrays[field.name])
    wanted = np.dtype(field.dtype)
    if data.ndim != len(field.shape) + 1 or tuple(data.shape[1:]) != field.shape or data.dtype.kind not in "fiub":
        raise UsageError(f"{where}: {field.name!r} must be numbers shaped [N, {', '.join(map(str, field.shape))}], "
                         f"got {data.dtype}{list(data.shape)}")  # fmt: skip
    if wanted.kind in "iu" and data.dtype.kind == "f":
        raise UsageError(f"{where}: {field.name!r} holds {data.dtype}, the policy takes {wanted}")
    return data.astype(wanted)
