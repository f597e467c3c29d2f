"""train --rollout-engine: rollouts through the policy's exported graph in ONNX Runtime, the learner's weights pushed
after each update, the engine's mismatch measured and corrected by truncated importance weights."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from inference.errors import UsageError
from msrl_consistency.artifacts import run_dir as rd
from msrl_consistency.config import TrainConfig
from msrl_consistency.training.loop import Trainer
from msrl_consistency.training.rollout import engines

TINY = dict(num_envs=4, num_steps=32, num_minibatches=2, update_epochs=2, updates_per_call=1, checkpoint_every=100,
            progress=False, eval_episodes=0)  # fmt: skip


def trainer(tmp_path: Path, name: str, **overrides) -> Trainer:
    values = {"env_id": "CartPole-v1", "total_steps": 256, **TINY, **overrides}
    rd.prepare_new_run_dir(tmp_path / name)
    return Trainer(TrainConfig(**values), tmp_path / name)


def test_auto_acts_through_onnxruntime_and_says_why(tmp_path):
    t = trainer(tmp_path, "auto")
    try:
        assert t.cfg.rollout_engine == "onnxruntime" and t.rollout.engine.corrects
        assert t.rollout_engine_reason.startswith("auto: ")
        lowered = trainer(tmp_path, "lowered", lower="fp16")
        assert lowered.cfg.rollout_engine == "mindspore" and "fp16" in lowered.rollout_engine_reason
        lowered.close()
    finally:
        t.close()
    with pytest.raises(UsageError, match="--rollout-engine onnxruntime acts for an fp32 actor"):
        TrainConfig(env_id="CartPole-v1", rollout_engine="onnxruntime", lower="int8").validate()
    with pytest.raises(UsageError, match="--rollout-engine must be auto, mindspore or onnxruntime"):
        TrainConfig(env_id="CartPole-v1", rollout_engine="vllm").validate()


@pytest.mark.parametrize("env_id", ["CartPole-v1", pytest.param("Pendulum-v1", marks=pytest.mark.slow)])
def test_the_engine_holds_the_learners_weights_bit_for_bit_after_each_update(tmp_path, env_id):
    t = trainer(tmp_path, "run", env_id=env_id)
    try:
        t.compile_graphs()
        t.push_weights()
        for _ in range(2):
            before = {name: p.asnumpy().copy() for name, p in t.rollout.engine.params}
            buf = t.collect()
            t.update_statistics(t.merge_ranks(buf, t.update(buf)))
            t.push_weights()
            engine = t.rollout.engine
            for name, param in engine.params:
                assert engine.weights[name].tobytes() == param.asnumpy().tobytes(), name
            for name in ("policy.actor.layers.0.weight", "policy.critic.layers.0.weight", "policy.normalizer.mean"):
                assert not np.array_equal(before[name], engine.weights[name]), name  # the update and the statistics
        # what the engine answers is what the learner's compiled graph answers, up to float rounding
        rng = np.random.default_rng(0)
        obs = rng.standard_normal((t.cfg.num_envs, t.spec.obs_dim)).astype(np.float32)
        noise = t.spec.sample_noise(rng, t.cfg.num_envs)
        ours = engines.MindSporeEngine(t.learner.rollout_net).act(obs, noise)
        np.testing.assert_allclose(engine.act(obs, noise), ours, rtol=1e-5, atol=1e-5)
    finally:
        t.close()


def test_a_skewed_engine_shows_in_the_metrics_and_the_correction_bounds_the_update(tmp_path):
    """A perturbed weight in the engine only (the learner's untouched): the rollout's log-probabilities are the
    engine's, the ratio is taken against the learner's own, every importance weight is at most the threshold."""
    t = trainer(tmp_path, "skewed")
    try:
        t.compile_graphs()
        t.push_weights()
        healthy = t.collect()
        assert t.mismatch["rollout_max_abs_dlogp"] < 1e-4 and t.mismatch["rollout_ess"] > 0.999999
        assert np.array_equal(healthy["is_weights"] <= engines.IS_THRESHOLD, np.ones_like(healthy["is_weights"], bool))
        engine = t.rollout.engine
        engine.weights["policy.actor.layers.4.bias"] += np.float32([3.0, -3.0])  # in place: the buffer it reads
        skewed = t.collect()
        m = t.mismatch
        assert m["rollout_max_abs_dlogp"] > 0.5 and m["rollout_is_mean"] < 0.6
        assert m["rollout_k3_kl"] > engines.MAX_K3_KL
        ratio = np.exp(skewed["logp"].astype(np.float64) - skewed["behaviour_logp"])
        expected = np.minimum(ratio, engines.IS_THRESHOLD).astype(np.float32)
        np.testing.assert_array_equal(skewed["is_weights"], expected)  # each row's ratio, truncated at the threshold
        assert not np.allclose(skewed["logp"], skewed["behaviour_logp"])  # the ratio's denominator is the learner's
        learner = engines.LearnerLogProb(t.policy)
        from mindspore import Tensor

        flat = skewed["obs"].reshape(-1, t.spec.obs_dim), skewed["actions"].reshape(-1)
        np.testing.assert_allclose(skewed["logp"].ravel(), learner(Tensor(flat[0]), Tensor(flat[1])).asnumpy(),
                                   rtol=1e-6, atol=1e-6)  # fmt: skip
        stats = t.update(skewed)
        assert np.isfinite(list(stats.values())).all()
        assert engines.unhealthy(m) is not None  # and the run warns about it
    finally:
        t.close()


@pytest.mark.slow
def test_a_seed_gives_the_same_run_on_either_engine(tmp_path):
    """Each engine gives one run per seed (twice the same metrics); the two engines act alike on the same noise."""
    from conftest import run_trainer

    rows = {}
    for name, engine in (("ort-a", "onnxruntime"), ("ort-b", "onnxruntime"), ("ms", "mindspore")):
        cfg = TrainConfig(env_id="CartPole-v1", total_steps=512, rollout_engine=engine, **TINY)
        run_trainer(cfg, tmp_path / name)
        with open(tmp_path / name / rd.METRICS_CSV, newline="") as fh:
            rows[name] = [{k: v for k, v in r.items() if k not in ("sps", "wall_time")} for r in csv.DictReader(fh)]
    assert rows["ort-a"] == rows["ort-b"]
    assert "rollout_is_mean" in rows["ort-a"][0] and "rollout_is_mean" not in rows["ms"][0]
    # the first rollout's episodes: the same actions from the same noise (the policies agree up to rounding)
    for key in ("episodes", "return_mean", "length_mean"):
        assert rows["ort-a"][0][key] == rows["ms"][0][key], key
