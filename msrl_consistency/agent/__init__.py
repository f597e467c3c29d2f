"""The policy: spec (I/O contract), in-graph pre/post-processing, networks, distributions, export heads."""

from msrl_consistency.agent.policy import ActorCritic, DeterministicPolicy, RolloutPolicy, StochasticPolicy
from msrl_consistency.agent.spec import PolicySpec

__all__ = ["ActorCritic", "DeterministicPolicy", "PolicySpec", "RolloutPolicy", "StochasticPolicy"]
