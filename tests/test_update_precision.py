"""``--update-precision``: fp32 and fp16 train on CPU with float32 master weights (fp16 loss-scaled and resumable
bitwise); bf16 stops with a clear error (no CPU kernel); what is exported stays a float32 graph that verifies."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from conftest import run_trainer
from mindspore import Tensor

import msrl_consistency.train as train
from inference.compare.verifier import VerifyOptions
from inference.errors import UsageError
from msrl_consistency import compat
from msrl_consistency.agent import ActorCritic, PolicySpec
from msrl_consistency.api import export_run, verify_run
from msrl_consistency.artifacts import run_dir as rd
from msrl_consistency.artifacts.bundle import ExportOptions
from msrl_consistency.artifacts.checkpoint import read_checkpoint
from msrl_consistency.config import TrainConfig
from msrl_consistency.training import update_precision as mp
from msrl_consistency.training.update_precision import LossScale

TINY = dict(env_id="CartPole-v1", num_envs=2, num_steps=16, num_minibatches=2, update_epochs=2, updates_per_call=2,
            total_steps=192, checkpoint_every=2, progress=False, eval_episodes=0)  # fmt: skip


def train_run(run_dir: Path, precision: str, stop_at: int | None = None, resume: bool = False) -> None:
    run_trainer(TrainConfig(**TINY, update_precision=precision), run_dir, stop_at, resume)


def weights(run_dir: Path) -> dict[str, np.ndarray]:
    return {k: v.asnumpy() for k, v in read_checkpoint(run_dir / rd.CHECKPOINT).items()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("precision")
    for precision in ("fp32", "fp16"):
        train_run(root / precision, precision)
    return {p: root / p for p in ("fp32", "fp16")}


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_update_precision_trains_with_fp32_master_weights(runs, precision):
    run_dir = runs[precision]
    info = rd.read_run_json(run_dir)
    assert info["precision"]["update"] == precision and info["precision"]["master_weights"] == "fp32"
    initial = {
        n: p.asnumpy() for n, p in ActorCritic(PolicySpec.from_dict(info["policy_spec"]), seed=1).parameters_and_names()
    }
    trained = weights(run_dir)
    assert all(v.dtype == np.float32 for v in trained.values())
    assert any(not np.array_equal(trained[n], initial[n]) for n in initial if "layers" in n)
    with open(run_dir / rd.METRICS_CSV, newline="") as fh:
        losses = [float(r["loss"]) for r in csv.DictReader(fh)]
    assert len(losses) == 6 and np.all(np.isfinite(losses))
    if precision == "fp16":
        scale = info["precision"]["loss_scale"]
        assert scale >= 1 and float(np.log2(scale)).is_integer()
        # The fp16 update computes differently (the weights move apart) but to the same effect (close).
        reference = weights(runs["fp32"])
        diffs = [np.abs(trained[n] - reference[n]).max() for n in reference]
        assert 0 < max(diffs) < 0.05
    else:
        assert info["precision"]["loss_scale"] is None


@pytest.mark.slow
def test_fp16_update_resumes_bitwise_with_its_loss_scale(runs, tmp_path):
    train_run(tmp_path / "cut", "fp16", stop_at=3)
    state = rd.load_resume_state(tmp_path / "cut" / rd.RESUME_STATE)
    assert {"loss_scale.scale", "loss_scale.good_steps", "loss_scale.skipped"} <= set(state["params"])
    train_run(tmp_path / "cut", "fp16", resume=True)
    expected, got = weights(runs["fp16"]), weights(tmp_path / "cut")
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


def test_bf16_update_is_a_clear_error_on_cpu(tmp_path):
    with pytest.raises(UsageError, match=r"--update-precision bf16 is not supported by MindSpore .* on CPU: .*MatMul"):
        train.main(["--update-precision", "bf16", "--run-dir", str(tmp_path / "run")])
    assert not (tmp_path / "run").exists()


def test_loss_scale_halves_and_skips_on_overflow_and_grows_after_a_window():
    scale = LossScale(init=8.0, factor=2.0, window=2)
    finite = scale.adjust(Tensor(False))
    assert not bool(finite.asnumpy()) and float(scale.scale.asnumpy()) == 4.0 and int(scale.skipped.asnumpy()) == 1
    scale.adjust(Tensor(True))
    assert float(scale.scale.asnumpy()) == 4.0
    scale.adjust(Tensor(True))  # the second finite update in a row: the window is full
    assert float(scale.scale.asnumpy()) == 8.0 and int(scale.good_steps.asnumpy()) == 0
    for _ in range(5):
        scale.adjust(Tensor(False))
    assert float(scale.scale.asnumpy()) == 1.0  # never below 1


@pytest.mark.slow
def test_an_overflowing_fp16_update_is_skipped_without_a_trace():
    # A loss scale of 2^100 overflows every fp16 gradient: both updates of the call must leave every weight,
    # Adam moment, beta power and step count exactly as they were, and halve the scale twice.
    from mindspore import nn

    from msrl_consistency.envs import describe_env
    from msrl_consistency.training.ppo import PPOLoss, PPOTrainStep

    compat.use_graph_mode()
    policy = ActorCritic(PolicySpec.from_env(describe_env("CartPole-v1"), hidden_sizes=[8]), seed=0)
    opt = nn.Adam(policy.trainable_params(), learning_rate=1e-2, eps=1e-5)
    loss = PPOLoss(policy, 0.2, 0.5, 0.01, True, mp.compute_dtype("fp16"))
    step = PPOTrainStep(loss, opt, 0.5, updates_per_call=2, loss_scale=LossScale(init=2.0**100))
    rng = np.random.default_rng(0)
    data = [Tensor(rng.standard_normal(16).astype(np.float32)) for _ in range(4)] + [Tensor(np.ones(16, np.float32))]
    obs, actions = Tensor(rng.standard_normal((16, 4)).astype(np.float32)), Tensor(np.zeros(16, np.float32))
    before = {p.name: p.asnumpy() for p in step.get_parameters()}
    step(obs, actions, *data, Tensor(np.arange(16, dtype=np.int32).reshape(2, 8)))
    after = {p.name: p.asnumpy() for p in step.get_parameters()}
    assert float(after["loss_scale.scale"]) == 2.0**98 and int(after["loss_scale.skipped"]) == 2
    for name, value in before.items():
        if not name.startswith("loss_scale."):
            np.testing.assert_array_equal(after[name], value, err_msg=name)


@pytest.mark.slow
def test_fp16_trained_policy_exports_an_fp32_graph_that_verifies(runs, tmp_path):
    ckpt = runs["fp16"] / rd.CHECKPOINT
    bundle = export_run(ckpt, tmp_path / "bundle", ExportOptions(formats=("mindir",)))
    assert bundle.manifest["precision"] == "fp32"
    outputs = bundle.manifest["graphs"]["policy"]["outputs"]
    assert [o["dtype"] for o in outputs] == ["int32", "float32"]
    result = verify_run(bundle, ckpt, VerifyOptions(observations=400, episodes=2, seed=3))
    assert result.exit_code == 0, [c.summary for c in result.failed]
    # MindSpore's graph paths replay the float32 checkpoint exactly: an fp16 graph could not.
    logits = next(c for c in result.checks if c.runtime == "ms-mindir" and c.name == "observations.policy")
    assert logits.metrics["outputs"]["logits"]["max_abs"] == 0.0
