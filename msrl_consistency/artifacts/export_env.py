"""The env a team's policy is exported for: found, and its spaces checked against the contract before any graph is
written, so that a contract describing another env is refused in one line (not found later as a reshape error).

``export --env`` takes a registered Gymnasium id or the team's own constructor (``MODULE:FACTORY``); without it the
contract's ``env_id`` is used when this machine can make that env (bounds and the check are then best effort: an env
whose package is not installed here leaves the bundle's bounds unknown, as before).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from inference.bundle.contract import PolicyContract
from inference.bundle.spaces import check_env_spaces
from inference.bundle.tensors import TensorMeta
from inference.compare.episodes import EnvSource
from inference.compare.inputs import env_factory_source, env_source
from inference.errors import UsageError, first_line


@dataclass(frozen=True)
class ExportEnv:
    env_id: str | None  # the manifest's env_id (a registered id), None for a team's own env
    factory: str | None  # MODULE:FACTORY of a team's own env (recorded; verify asks for it again)
    info: dict[str, Any] | None  # the manifest's ``env``: observation bounds, where known
    spaces: tuple[Any, Any, str] | None = None  # (observation space, action space, label) when the env was made

    def check_outputs(self, contract: PolicyContract, outputs: tuple[TensorMeta, ...]) -> None:
        """The Cell's probed outputs against the env's actions (the number of scores of each discrete head)."""
        if self.spaces is None:
            return
        obs_space, act_space, label = self.spaces
        shapes = {t.name: t.shape for t in outputs}
        check_env_spaces(contract, obs_space, act_space, lambda name: shapes[name][-1], f"contract vs env {label}",
                         lambda name: shapes[name])  # fmt: skip


def export_env(contract: PolicyContract, env: str | Callable[[], Any] | None) -> ExportEnv:
    """The env for the manifest, with ``contract`` checked against its spaces (``UsageError`` when they disagree;
    the outputs' widths are checked by ``ExportEnv.check_outputs`` once the Cell is probed). ``env``: ``--env`` (an
    id, ``MODULE:FACTORY`` or a callable)."""
    explicit = env is not None
    if env is None:
        env = contract.env_id
    if env is None:
        return ExportEnv(None, None, None)
    is_id = isinstance(env, str) and ":" not in env
    try:
        source = env_source(env) if is_id else env_factory_source(env)  # type: ignore[arg-type]
        made = source.make()
    except UsageError:
        if explicit:
            raise
        return ExportEnv(contract.env_id, None, None)  # the contract's env is not installed here: not checked
    except Exception as exc:  # noqa: BLE001 - the env's own constructor may raise anything
        if explicit:
            raise UsageError(f"--env {env}: constructing the env failed: {first_line(exc)}") from None
        return ExportEnv(contract.env_id, None, None)
    try:
        obs_space, act_space = made.observation_space, made.action_space
    finally:
        made.close()
    check_env_spaces(contract, obs_space, act_space, lambda name: None, f"contract vs env {source.label}")
    env_id = str(env) if is_id else None
    factory = None if is_id else _label(env, source)
    return ExportEnv(env_id, factory, _info(env_id, obs_space), (obs_space, act_space, source.label))


def _label(env: Any, source: EnvSource) -> str:
    return env if isinstance(env, str) else source.label


def _info(env_id: str | None, obs_space: Any) -> dict[str, Any] | None:
    """Our trainer's description of a registered env where it has one, else the bounds of a Box observation."""
    if env_id is not None:
        from msrl_consistency.envs import describe_env

        try:
            return describe_env(env_id).to_dict()
        except UsageError:
            pass  # spaces our trainer does not train on (frames, Discrete observations): the bounds alone
    import gymnasium as gym

    if not isinstance(obs_space, gym.spaces.Box) or np.dtype(obs_space.dtype).kind != "f":
        return None
    low, high = (np.asarray(b, np.float64).ravel() for b in (obs_space.low, obs_space.high))
    return {"obs_low": low.tolist(), "obs_high": high.tolist()}
