"""``PolicySpec`` takes its architecture fields from ``TrainConfig``: one source of truth for names, types, defaults."""

from __future__ import annotations

import dataclasses
import typing

from msrl_consistency.agent.spec import ARCH_FIELDS, PolicySpec
from msrl_consistency.config import TrainConfig
from msrl_consistency.envs import describe_env


def test_architecture_fields_are_the_configs_with_its_types_and_defaults():
    spec_hints, config_hints = typing.get_type_hints(PolicySpec), typing.get_type_hints(TrainConfig)
    env_fields = {"obs_dim", "action_kind", "action_dim", "action_low", "action_high"}
    assert set(ARCH_FIELDS) == {f.name for f in dataclasses.fields(PolicySpec)} - env_fields
    spec, config = PolicySpec(obs_dim=4, action_kind="discrete", action_dim=2), TrainConfig()
    for name in ARCH_FIELDS:
        assert spec_hints[name] == config_hints[name], name
        assert getattr(spec, name) == getattr(config, name), name
    assert spec.hidden_sizes is not config.hidden_sizes  # each spec holds a list of its own


def test_a_spec_from_a_config_copies_its_architecture():
    cfg = TrainConfig(hidden_sizes=[32, 16], activation="relu", normalize_obs=False, clip_obs=5.0,
                      action_postprocess="tanh", init_log_std=-0.5)  # fmt: skip
    spec = PolicySpec.from_config(cfg, describe_env("Pendulum-v1"))
    assert {name: getattr(spec, name) for name in ARCH_FIELDS} == {name: getattr(cfg, name) for name in ARCH_FIELDS}
    assert (spec.obs_dim, spec.action_kind, spec.action_high) == (3, "box", [2.0])
    cfg.hidden_sizes.append(8)
    assert spec.hidden_sizes == [32, 16]
