"""No false verdict on policies as they are published: a batch effect is not a runtime fault, a batch-coupled output
is named as such, a runtime that answers another batch fails with the shapes, and a failure says how far off it is.

Policies come from ``shaped_policies`` (stand-ins of the MindSpore RL library's shapes and of teams' own).
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import shaped_policies as sp

from inference.compare.verifier import VerifyOptions
from msrl_consistency.api import export_policy, verify_policy
from msrl_consistency.artifacts import graphs
from msrl_consistency.artifacts.bundle import ExportCheckFailed, ExportOptions

EVERY_RUNTIME = ("ms-graph", "ms-mindir", "lite", "onnxruntime")


def small(**kwargs) -> VerifyOptions:
    return VerifyOptions(**{"observations": 400, "episodes": 3, "seed": 0, **kwargs})


def test_a_sac_actor_of_256_256_layers_verifies_when_genuine(tmp_path):
    """Trained-magnitude 256-256 weights: PyNative moves a row by a few ULP between batches of 3 and of thousands,
    and ``std * noise`` carries that past MindSpore's 1e-6 tolerance. The episodes ran at batch 3: so does their
    teacher-forced replay, and no runtime fails on the batch effect."""
    bundle = export_policy(sp.make_sac256(), sp.SAC256_CONTRACT, tmp_path / "sac")
    result = verify_policy(sp.make_sac256(), None, bundle.root, options=small(required=EVERY_RUNTIME))
    assert result.exit_code == 0, result.console_table(only_failed=True)
    assert set(EVERY_RUNTIME) <= set(result.compared)
    teacher = [c for c in result.checks if c.name.startswith("episodes.teacher_forced") and c.runtime == "ms-graph"]
    assert teacher and all("max |diff|" in c.summary for c in teacher), [c.summary for c in teacher]


def test_a_teacher_forced_failure_says_how_far_the_actions_are():
    """Counts with magnitudes: "N of M actions differ by more than atol (max |diff| X)", never counts alone."""
    from inference.bundle.contract import PolicyContract
    from inference.compare.episodes import EpisodeTrace
    from inference.compare.episodes.checks import teacher_forced_check

    contract = PolicyContract.from_dict(sp.LOG_STD_CONTRACT)

    class Shifted:  # a runtime whose actions are 3e-3 off on every second step
        def __init__(self) -> None:
            self.contract, self.state, self.t = contract, None, 0

        def reset(self, batch: int) -> None:
            self.t = 0

        def act(self, obs, noise):  # noqa: ANN001, ANN201
            self.t += 1
            return obs[:, :1] + (3e-3 if self.t % 2 else 0.0)

    obs = np.random.default_rng(0).normal(size=(10, 2, 3)).astype(np.float32)
    trace = EpisodeTrace(obs, obs[..., :1].copy(), np.zeros((10, 2)), np.ones((10, 2), bool))
    check = teacher_forced_check("lite", "deterministic", trace, Shifted(), None, 1e-4)
    assert check.status == "fail"
    assert check.summary.startswith("10 of 20 actions differ by more than 1.0e-04 (max |diff| 3.00e-03)"), check.summary
    assert check.metrics["max_abs_action_diff"] == pytest.approx(3e-3, rel=1e-3)


def test_a_batch_coupled_output_is_named_as_such_not_as_training_mode(tmp_path):
    """The Dueling head's mean with no axis averages over the batch: caught, and diagnosed as the network coupling
    rows (the Cell does it too), not as BatchNorm in training mode on a net that has none."""
    try:
        export_policy(sp.make_dueling(), sp.DUELING_CONTRACT, tmp_path / "dueling")
    except ExportCheckFailed as exc:  # Lite's .ms of the batch mean differs: marked failed, MindIR and ONNX kept
        assert "policy.ms failed" in str(exc)
    result = verify_policy(sp.make_dueling(), None, tmp_path / "dueling",
                           options=small(runtimes=("ms-mindir", "onnxruntime")))  # fmt: skip
    assert result.exit_code == 1
    repeat = [c for c in result.checks if c.name == "repeatability"]
    assert repeat and all(c.status == "fail" for c in repeat), result.console_table()
    for c in repeat:
        assert c.diagnosis["stage"] == "batch-coupled", c.diagnosis
        assert "in the Cell as in" in c.diagnosis["detail"] and "BatchNorm" not in c.diagnosis["detail"]


def test_a_batch_size_effect_alone_is_measured_not_failed(tmp_path):
    """The same rows in batches of 32 and 64 may differ by a few ULP (kernels block by shape): reported, never a
    coupling; a row among other rows of the same batch size gives the same outputs."""
    bundle = export_policy(sp.make_sac256(), sp.SAC256_CONTRACT, tmp_path / "sac")
    result = verify_policy(sp.make_sac256(), None, bundle.root, options=small(runtimes=("ms-mindir",), episodes=1))
    repeat = next(c for c in result.checks if c.name == "repeatability")
    assert repeat.status == "pass" and "do not depend on the other rows of its batch" in repeat.summary, repeat
    assert "batch_size_effect_max_abs" in repeat.metrics


def test_a_runtime_answering_another_batch_fails_with_the_shapes(tmp_path, monkeypatch):
    """MindSpore's dynamic-batch MindIR of an ``nn.GRU`` net as MindSpore writes it (export writes a substitute)
    keeps the batch of its first call: that runtime fails, with the shapes, instead of verify ending in an internal
    error."""
    out = tmp_path / "gru"
    monkeypatch.setattr(graphs, "substituted", lambda *args, **kwargs: contextlib.nullcontext([]))
    export_policy(sp.make_gru_agent(), sp.GRU_CONTRACT, out, options=ExportOptions(formats=("mindir",)))
    result = verify_policy(sp.make_gru_agent(), None, out, options=small(runtimes=("ms-mindir",), episodes=2))
    assert result.exit_code == 1, result.console_table()
    failed = [c for c in result.failed if c.runtime == "ms-mindir"]
    assert [c.name for c in failed] == ["inference"], result.console_table()
    assert "returned output 'q' of shape [" in failed[0].summary and "the graph declares [-1, 2]" in failed[0].summary
    assert failed[0].diagnosis["stage"] == "runtime"
