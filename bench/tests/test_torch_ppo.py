"""bench/torch_ppo.py, the PyTorch twin: its hyperparameters are TrainConfig's, names and defaults alike."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import fields
from unittest import mock

from bench_script import load

from msrl_consistency.config import TrainConfig


def load_twin(monkeypatch):
    if importlib.util.find_spec("torch") is None:  # the bench extra is not installed: the defaults need no PyTorch
        import gymnasium  # noqa: F401  (imported before the stand-ins, so it never sees them)

        for name in ("torch", "torch.nn", "torch.distributions"):
            monkeypatch.setitem(sys.modules, name, mock.MagicMock())
    return load("torch_ppo")


def test_the_twin_defaults_to_train_config(monkeypatch):
    twin = load_twin(monkeypatch)
    ours, hp = TrainConfig(), twin.HParams()
    for f in fields(hp):
        expected = getattr(ours, f.name)
        assert getattr(hp, f.name) == (tuple(expected) if isinstance(expected, list) else expected), f.name


def test_every_key_the_twin_knows_or_ignores_is_a_train_config_field(monkeypatch):
    twin = load_twin(monkeypatch)
    config_fields = {f.name for f in fields(TrainConfig)}
    assert {f.name for f in fields(twin.HParams)} <= config_fields
    assert not twin.IGNORED_KEYS - config_fields  # a misspelt key here would let a preset's typo through silently
