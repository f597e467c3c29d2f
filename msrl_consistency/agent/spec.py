"""PolicySpec: everything needed to rebuild the policy Cell and to describe its graphs to any runtime."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from msrl_consistency.config import TrainConfig
from msrl_consistency.envs.make import EnvInfo

# The training config's fields that shape the policy Cell and its graphs. A spec copies them from the config and
# takes its defaults from the config's, so the two never disagree (``tests/test_policy_spec.py`` checks the types).
ARCH_FIELDS = (
    "hidden_sizes",
    "activation",
    "normalize_obs",
    "clip_obs",
    "action_postprocess",
    "init_log_std",
    "lower",
    "keep",
)
_CONFIG_DEFAULTS = TrainConfig()


def _config_default(name: str) -> Any:
    value = getattr(_CONFIG_DEFAULTS, name)
    return field(default_factory=lambda: list(value)) if isinstance(value, list) else field(default=value)


def _copied(value: Any) -> Any:
    """A list field as a list of its own: the spec is frozen, the config is not."""
    return list(value) if isinstance(value, list | tuple) else value


@dataclass(frozen=True)
class PolicySpec:
    """Architecture and processing choices; stored in run.json and in the bundle manifest."""

    obs_dim: int
    action_kind: str  # "discrete" | "box"
    action_dim: int
    action_low: list[float] = field(default_factory=list)
    action_high: list[float] = field(default_factory=list)
    hidden_sizes: list[int] = _config_default("hidden_sizes")
    activation: str = _config_default("activation")
    normalize_obs: bool = _config_default("normalize_obs")
    clip_obs: float = _config_default("clip_obs")
    action_postprocess: str = _config_default("action_postprocess")
    init_log_std: float = _config_default("init_log_std")
    lower: str = _config_default("lower")  # the actor trunk's numerics (``agent.lowered``)
    keep: list[str] = _config_default("keep")  # its layers kept in fp32 under ``lower``

    @property
    def discrete(self) -> bool:
        return self.action_kind == "discrete"

    @property
    def noise_dim(self) -> int:
        """Uniform noise per action logit (Gumbel-max) or standard normal noise per action dimension."""
        return self.action_dim

    @property
    def noise_kind(self) -> str:
        return "uniform" if self.discrete else "normal"

    def sample_noise(self, rng: np.random.Generator, batch: int) -> np.ndarray:
        """Host-side sampling noise: the only source of randomness when acting."""
        if self.discrete:
            return rng.random((batch, self.noise_dim), dtype=np.float32)
        return rng.standard_normal((batch, self.noise_dim), dtype=np.float32)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PolicySpec:
        return cls(**data)

    @classmethod
    def from_env(cls, info: EnvInfo, **arch: Any) -> PolicySpec:
        return cls(
            obs_dim=info.obs_dim,
            action_kind=info.action_kind,
            action_dim=info.action_dim,
            action_low=list(info.action_low),
            action_high=list(info.action_high),
            **arch,
        )

    @classmethod
    def from_config(cls, cfg: TrainConfig, info: EnvInfo) -> PolicySpec:
        """The spec a training run with ``cfg`` builds for the env ``info`` describes."""
        return cls.from_env(info, **{name: _copied(getattr(cfg, name)) for name in ARCH_FIELDS})
