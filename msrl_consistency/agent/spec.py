"""PolicySpec: everything needed to rebuild the policy Cell and to describe its graphs to any runtime."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from msrl_consistency.envs.make import EnvInfo


@dataclass(frozen=True)
class PolicySpec:
    """Architecture and processing choices; stored in run.json and in the bundle manifest."""

    obs_dim: int
    action_kind: str  # "discrete" | "box"
    action_dim: int
    action_low: list[float] = field(default_factory=list)
    action_high: list[float] = field(default_factory=list)
    hidden_sizes: list[int] = field(default_factory=lambda: [64, 64])
    activation: str = "tanh"
    normalize_obs: bool = True
    clip_obs: float = 10.0
    action_postprocess: str = "clip"
    init_log_std: float = 0.0

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
