"""Environments: creation without preprocessing wrappers (preprocessing lives in the graph)."""

from msrl_consistency.envs.make import EnvInfo, describe_env, make_env, make_vector_env

__all__ = ["EnvInfo", "describe_env", "make_env", "make_vector_env"]
