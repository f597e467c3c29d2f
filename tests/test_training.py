"""Training reliability on tiny budgets: determinism, exact resume, truncation bootstrap, run dir contents."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import run_trainer as train
from mindspore import Tensor

from inference.errors import UsageError
from msrl_consistency.artifacts import run_dir as rd
from msrl_consistency.artifacts.checkpoint import load_policy, read_checkpoint
from msrl_consistency.config import TrainConfig
from msrl_consistency.training.loop import Trainer

# One update per compiled call (conftest.TINY_RUN's reason); the tests of grouped updates set updates_per_call.
TINY = dict(num_envs=2, num_steps=16, num_minibatches=2, update_epochs=2, updates_per_call=1, checkpoint_every=2,
            progress=False)  # fmt: skip
TIMING_COLUMNS = {"sps", "wall_time"}


def tiny_config(**overrides) -> TrainConfig:
    values = {"env_id": "CartPole-v1", "total_steps": 128, "eval_episodes": 0, **TINY, **overrides}
    return TrainConfig(**values)


def metrics_without_timing(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / rd.METRICS_CSV, newline="") as fh:
        return [{k: v for k, v in row.items() if k not in TIMING_COLUMNS} for row in csv.DictReader(fh)]


def weights(run_dir: Path) -> dict[str, np.ndarray]:
    return {k: v.asnumpy() for k, v in read_checkpoint(run_dir / rd.CHECKPOINT).items()}


def update_calls(run_dir: Path) -> int:
    """Compiled update calls the run made (its profile.json: the run needs ``profile=True``)."""
    return json.loads((run_dir / "profile.json").read_text())["sections"]["update"]["calls"]


def assert_same_weights(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


# auto: EnvPool for CartPole, gymnasium for Pendulum (EnvPool's differs). Gymnasium's CartPole runs the same graphs
# as EnvPool's (the pinning is the op threads'): its run-to-run bits are test_resume_equals_uninterrupted_run's.
@pytest.mark.slow
@pytest.mark.parametrize(("env_id", "backend"), [("CartPole-v1", "auto"), ("Pendulum-v1", "auto")])
def test_same_seed_gives_bitwise_identical_metrics_and_weights(tmp_path, env_id, backend):
    cfg = tiny_config(env_id=env_id, env_backend=backend)
    train(cfg, tmp_path / "a")
    train(tiny_config(env_id=env_id, env_backend=backend, cpu_pin="off"), tmp_path / "b")  # threads on every CPU
    pinned, free = (rd.read_run_json(tmp_path / run)["cpu_pin"] for run in ("a", "b"))
    assert pinned["cpu"] is not None and free == {"cpu": None, "reason": "--cpu-pin off"}
    assert metrics_without_timing(tmp_path / "a") == metrics_without_timing(tmp_path / "b")
    assert_same_weights(weights(tmp_path / "a"), weights(tmp_path / "b"))
    other = tiny_config(env_id=env_id, env_backend=backend, seed=2)
    train(other, tmp_path / "c")
    assert metrics_without_timing(tmp_path / "a") != metrics_without_timing(tmp_path / "c")


@pytest.mark.slow
def test_a_run_reusing_an_earlier_runs_graphs_trains_as_a_fresh_process_does(tmp_path):
    """The next run of a graph key in a process takes the finished run's compiled Cells, every Parameter reset to a
    fresh build's (its own seed's weights, zero Adam moments): bitwise the run a fresh process trains. A run still
    open keeps its Cells."""
    for run in ("first", "other", "taker", "another"):
        rd.prepare_new_run_dir(tmp_path / run)
    first = Trainer(tiny_config(env_id="Pendulum-v1", seed=5, eval_episodes=2), tmp_path / "first")
    other = Trainer(tiny_config(env_id="Pendulum-v1", seed=5, eval_episodes=2), tmp_path / "other")
    assert other.learner is not first.learner and not other.learner.reused  # both open: nothing shared
    first.run()
    first.evaluate(2)
    first.close()
    other.close()  # it never compiled: nothing to keep
    cfg = tiny_config(env_id="Pendulum-v1", seed=6, eval_episodes=2)
    taker = Trainer(cfg, tmp_path / "taker")
    assert taker.learner is first.learner and taker.learner.reused
    first.close()  # closing again does not offer the Cells the taker holds
    another = Trainer(cfg, tmp_path / "another")
    assert another.learner is not taker.learner and not another.learner.reused
    another.close()
    taker.close()
    train(cfg, tmp_path / "reused")
    assert rd.read_run_json(tmp_path / "reused")["compile_cache"]["state"] == "reused"
    code = (
        "import json, sys\nfrom msrl_consistency import train_policy\n"
        "from msrl_consistency.config import from_dict\ntrain_policy(from_dict(json.loads(sys.argv[1])))"
    )
    fresh = {**cfg.to_dict(), "run_dir": str(tmp_path / "fresh"), "compile_cache": False}
    subprocess.run([sys.executable, "-c", code, json.dumps(fresh)], check=True, capture_output=True, timeout=300)
    assert rd.read_run_json(tmp_path / "fresh")["compile_cache"]["state"] == "off"
    assert metrics_without_timing(tmp_path / "reused") == metrics_without_timing(tmp_path / "fresh")
    assert_same_weights(weights(tmp_path / "reused"), weights(tmp_path / "fresh"))
    evals = [rd.read_run_json(tmp_path / run)["eval"] for run in ("reused", "fresh")]
    assert evals[0] == evals[1] and evals[0]


def test_kept_cells_that_do_not_match_a_fresh_build_are_left_alone():
    """A kept Learner is taken only if it holds the fresh build's Parameters (names, shapes, dtypes); otherwise the
    run gets the fresh build and the kept one is not touched."""
    from msrl_consistency.envs import describe_env
    from msrl_consistency.training import learner as lrn

    cfg, other = tiny_config(), tiny_config(hidden_sizes=[8, 8])
    spec, other_spec = (lrn.build_spec(c, describe_env(c.env_id)) for c in (cfg, other))
    kept = lrn.build_learner(other, other_spec)
    kept.key, kept.compiled = lrn.run_graph_key(cfg, spec, 1), True  # as if kept under this config's key
    before = kept.policy.trainable_params()[0].asnumpy().copy()
    lrn.release(kept)
    got = lrn.learner_for_run(cfg, spec)
    assert got is not kept and not got.reused and lrn._idle.get(got.key) is None
    np.testing.assert_array_equal(kept.policy.trainable_params()[0].asnumpy(), before)


def test_runs_started_while_kept_runs_are_set_aside_build_their_own_and_the_kept_ones_come_back():
    """``kept_runs_set_aside`` (a benchmark's baseline that must compile): inside, a run with a kept run's graph key
    builds its own Cells; after, the kept run is offered again and what the block's runs left is dropped."""
    from msrl_consistency.envs import describe_env
    from msrl_consistency.training import learner as lrn

    cfg, other = tiny_config(hidden_sizes=[6, 6]), tiny_config(hidden_sizes=[5, 5])  # graph keys no other test keeps
    spec, other_spec = (lrn.build_spec(c, describe_env(c.env_id)) for c in (cfg, other))
    kept = lrn.build_learner(cfg, spec)
    kept.key, kept.compiled = lrn.run_graph_key(cfg, spec, 1), True  # as a finished run leaves it
    lrn.release(kept)
    with lrn.kept_runs_set_aside():
        inside = lrn.learner_for_run(cfg, spec)
        assert inside is not kept and not inside.reused
        left = lrn.learner_for_run(other, other_spec)
        for finished in (inside, left):  # the block's runs finish: dropped at the end of the block
            finished.compiled = True
            lrn.release(finished)
    again = lrn.learner_for_run(cfg, spec)
    assert again is kept and again.reused
    assert lrn.learner_for_run(other, other_spec) is not left


@pytest.mark.slow
def test_periodic_evaluation_is_logged_and_leaves_training_unchanged(tmp_path):
    cfg = tiny_config()  # 4 iterations
    train(cfg, tmp_path / "plain")
    train(tiny_config(eval_every=2, eval_episodes=2), tmp_path / "evals")
    assert not (tmp_path / "plain" / rd.EVALS_CSV).exists()
    with open(tmp_path / "evals" / rd.EVALS_CSV, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["global_step"]) for r in rows] == [64, 128]
    assert all(int(r["episodes"]) == 2 and float(r["return_mean"]) >= float(r["return_min"]) > 0 for r in rows)
    assert all(float(r["seconds"]) > 0 and float(r["cpu_seconds"]) > 0 for r in rows)  # both leave the bench's SPS
    # Evaluation uses its own envs and seeds: the training itself is bitwise the same.
    assert metrics_without_timing(tmp_path / "plain") == metrics_without_timing(tmp_path / "evals")
    assert_same_weights(weights(tmp_path / "plain"), weights(tmp_path / "evals"))


@pytest.mark.slow
def test_an_evaluation_episode_does_not_depend_on_how_many_are_played(tmp_path):
    """Evaluation plays its episodes in lockstep, EVAL_BATCH rows per act call: episode k's return is the same
    whether 1, 3 or 20 episodes (two calls' worth) are evaluated, to the last bit (Pendulum: float returns)."""
    from msrl_consistency.training.evaluate import EVAL_BATCH

    rd.prepare_new_run_dir(tmp_path / "run")
    trainer = Trainer(tiny_config(env_id="Pendulum-v1", eval_episodes=3), tmp_path / "run")
    try:
        trainer.run()
        one, three, many = trainer.evaluate(1), trainer.evaluate(3), trainer.evaluate(EVAL_BATCH + 4)
    finally:
        trainer.close()
    assert len(three) == 3 and len(many) == EVAL_BATCH + 4
    assert one == three[:1] and three == many[:3]
    assert len(set(many)) == len(many)  # each episode its own seed, start and return


# EnvPool's state is restored by replaying each env's resets and current episode (Box2D and MuJoCo included);
# gymnasium's classic-control envs are pickled. Pendulum runs its preset's split update.
@pytest.mark.slow
@pytest.mark.parametrize(("env_id", "backend", "graphs"), [
    ("CartPole-v1", "envpool", "fused"), ("BipedalWalker-v3", "envpool", "fused"), ("Hopper-v5", "envpool", "fused"),
    ("CartPole-v1", "gymnasium", "fused"), ("Pendulum-v1", "gymnasium", "split"),
])  # fmt: skip
def test_resume_equals_uninterrupted_run(tmp_path, env_id, backend, graphs):
    cfg = tiny_config(env_id=env_id, env_backend=backend, total_steps=192, update_graphs=graphs)  # 6 iterations
    train(cfg, tmp_path / "full")
    train(cfg, tmp_path / "cut", stop_at=3)  # "crashes" after iteration 3; last checkpoint at 2
    state = rd.load_resume_state(tmp_path / "cut" / rd.RESUME_STATE)
    assert state["iteration"] == 2
    resumed = train(cfg, tmp_path / "cut", resume=True)
    assert resumed.resume_exact and resumed.env_backend == backend
    assert metrics_without_timing(tmp_path / "full") == metrics_without_timing(tmp_path / "cut")
    assert_same_weights(weights(tmp_path / "full"), weights(tmp_path / "cut"))


@pytest.mark.slow
def test_run_dir_contents_and_strict_reload(tmp_path):
    cfg = tiny_config(env_id="Pendulum-v1", eval_episodes=0)
    result = train(cfg, tmp_path / "run")
    info = json.loads((tmp_path / "run" / rd.RUN_JSON).read_text())
    assert info["env_id"] == "Pendulum-v1" and info["global_step"] == 128
    assert info["env_backend"]["name"] == "gymnasium" and info["config"]["env_backend"] == "gymnasium"
    assert 100 < info["peak_rss_mb"] < 10_000
    assert list(info["rss_mb"]) == list(info["private_rss_mb"]) == ["after imports", "after setup", "after compile"]
    assert info["policy_spec"]["action_kind"] == "box" and info["policy_spec"]["action_high"] == [2.0]
    assert set(info["versions"]) >= {"python", "mindspore", "gymnasium", "numpy"}
    assert info["normalization"]["count"] > 128
    assert result.checkpoint == tmp_path / "run" / rd.CHECKPOINT and result.global_step == 128
    assert result.policy_spec.to_dict() == info["policy_spec"]
    policy = load_policy(result.checkpoint, result.policy_spec)
    # The frozen statistics in the checkpoint are exactly the ones in run.json (as float32).
    np.testing.assert_array_equal(policy.normalizer.mean.asnumpy(), np.float32(info["normalization"]["mean"]))
    header = (tmp_path / "run" / rd.METRICS_CSV).read_text().splitlines()[0].split(",")
    for column in ("return_mean", "approx_kl", "clipfrac", "explained_variance", "sps", "entropy"):
        assert column in header


def test_truncated_steps_bootstrap_the_final_value(tmp_path):
    # Chain of length 100 truncated by TimeLimit at 50 steps: rewards at t=49 carry gamma * V(final obs).
    cfg = tiny_config(env_id="msrl/Chain-v0", num_envs=1, num_steps=50, num_minibatches=1, total_steps=50)
    rd.prepare_new_run_dir(tmp_path / "run")
    trainer = Trainer(cfg, tmp_path / "run")
    import gymnasium as gym

    trainer.rollout.envs.close()
    trainer.rollout.envs = gym.vector.SyncVectorEnv(
        [lambda: gym.make("msrl/Chain-v0", length=100)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
    trainer.rollout.reset(seed=0)
    buf = trainer.collect()
    trainer.close()
    final_value = trainer.policy.value(Tensor(np.array([[50.0, 1.0]], np.float32))).asnumpy()[0]
    assert buf["dones"][49, 0] and not buf["dones"][:49].any()
    assert buf["rewards"][49, 0] == pytest.approx(1.0 + cfg.gamma * final_value, rel=1e-5)
    np.testing.assert_array_equal(buf["rewards"][:49, 0], 1.0)


@pytest.mark.slow
def test_stop_at_return_ends_the_run_at_the_first_evaluation_reaching_it(tmp_path):
    # CartPole's deterministic episodes last > 5 steps: the first evaluation (iteration 2 of 4) reaches 5.
    early = train(tiny_config(eval_every=2, eval_episodes=1, stop_at_return="5"), tmp_path / "early")
    assert (early.iteration, early.stopped_at_return["iteration"]) == (2, 2)
    assert rd.read_run_json(tmp_path / "early")["stopped_at_return"]["global_step"] == 64
    # The learning rate anneals over the whole budget, so the iterations done are an unstopped run's, bit for bit.
    full = train(tiny_config(eval_every=2, eval_episodes=1, stop_at_return="1e9"), tmp_path / "full")
    assert full.iteration == 4 and full.stopped_at_return is None
    assert metrics_without_timing(tmp_path / "early") == metrics_without_timing(tmp_path / "full")[:2]
    with pytest.raises(UsageError, match="needs --eval-every"):
        tiny_config(stop_at_return="5").validate()
    with pytest.raises(UsageError, match="must be a number"):
        tiny_config(eval_every=2, eval_episodes=1, stop_at_return="high").validate()


@pytest.mark.slow
def test_async_and_sharded_vector_envs_match_sync(tmp_path):
    # Subprocess envs (one per env, or a helper stepping a shard) step the same seeded envs: identical metrics to the
    # in-process vector env.
    train(tiny_config(total_steps=64, env_backend="gymnasium"), tmp_path / "sync")
    train(tiny_config(total_steps=64, async_envs=True), tmp_path / "async")
    train(tiny_config(total_steps=64, env_backend="gymnasium", env_threads=2), tmp_path / "sharded")
    assert metrics_without_timing(tmp_path / "sync") == metrics_without_timing(tmp_path / "async")
    assert metrics_without_timing(tmp_path / "sync") == metrics_without_timing(tmp_path / "sharded")
    steppers = rd.read_run_json(tmp_path / "sharded")["env_steppers"]
    assert steppers["processes"] == 2 and len(steppers["helpers_peak_rss_mb"]) == 1
    assert rd.read_run_json(tmp_path / "sync")["env_steppers"] == {"processes": 1, "helpers_peak_rss_mb": []}


@pytest.mark.slow
def test_gymnasium_box2d_resume_restarts_episodes_and_says_so(tmp_path):
    # gymnasium's Box2D envs hold C handles that cannot be pickled: resume restarts their episodes (EnvPool's
    # BipedalWalker replays instead, see test_resume_equals_uninterrupted_run).
    cfg = tiny_config(env_id="BipedalWalker-v3", env_backend="gymnasium", total_steps=128)
    train(cfg, tmp_path / "cut", stop_at=3)
    state = rd.load_resume_state(tmp_path / "cut" / rd.RESUME_STATE)
    assert state["ranks"][0]["env_blobs"] is None
    resumed = train(cfg, tmp_path / "cut", resume=True)
    assert not resumed.resume_exact
    assert json.loads((tmp_path / "cut" / rd.RUN_JSON).read_text())["resume_exact"] is False


@pytest.mark.slow
def test_a_compiled_call_may_span_an_epoch_boundary(tmp_path):
    # 2 minibatches x 3 epochs: calls of 3 updates hold the end of one epoch and the start of the next. Same shuffles,
    # same update order as one update per call, so the weights agree to the last bits.
    train(tiny_config(num_minibatches=2, update_epochs=3, total_steps=64, updates_per_call=3, profile=True),
          tmp_path / "three")  # fmt: skip
    train(tiny_config(num_minibatches=2, update_epochs=3, total_steps=64, updates_per_call=1, profile=True),
          tmp_path / "one")  # fmt: skip
    assert (update_calls(tmp_path / "three"), update_calls(tmp_path / "one")) == (2 * 2, 2 * 6)  # 2 iterations
    assert tiny_config(num_minibatches=2, update_epochs=3, updates_per_call=0).train_call_updates == 3  # auto spans too
    a, b = weights(tmp_path / "three"), weights(tmp_path / "one")
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.slow
def test_updates_per_call_is_a_config_choice(tmp_path):
    # Grouping minibatch updates into compiled calls changes the weights only in the last bits (measured ~1e-9 here),
    # which is why it is a setting (presets choose 2 for memory) and not a changed default.
    cfg = tiny_config(env_id="Pendulum-v1", num_minibatches=8, total_steps=64, updates_per_call=8, profile=True)
    train(cfg, tmp_path / "eight")
    train(tiny_config(env_id="Pendulum-v1", num_minibatches=8, total_steps=64, updates_per_call=2, profile=True),
          tmp_path / "two")  # fmt: skip
    assert (update_calls(tmp_path / "eight"), update_calls(tmp_path / "two")) == (2 * 2, 2 * 8)  # 16 updates each
    a, b = weights(tmp_path / "eight"), weights(tmp_path / "two")
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.slow
def test_reward_normalisation_divides_by_the_running_return_std(tmp_path):
    """--normalize-reward: rewards divided by the std of every env's discounted return, measured over the previous
    iterations (the first rollout has none yet, so only --reward-scale applies)."""
    cfg = tiny_config(normalize_reward=True, num_envs=4, num_steps=64)
    rd.prepare_new_run_dir(tmp_path / "direct")
    trainer = Trainer(cfg, tmp_path / "direct")
    try:
        buf = trainer.collect()
        np.testing.assert_array_equal(buf["rewards"], 1.0)  # CartPole: 1 per step, no truncation within 64 steps
        expected, running = np.zeros((64, 4)), np.zeros(4)
        for t in range(64):
            running = running * cfg.gamma + 1.0
            expected[t] = running
            running[buf["dones"][t]] = 0.0
        assert buf["dones"].any(), "the rollout must end episodes"
        np.testing.assert_allclose(buf["returns_seen"], expected)
        merged = trainer.merge_ranks(buf, trainer.update(buf))
        trainer.ret_rms.update_from_moments(*merged["ret_moments"])
        assert trainer.ret_rms.var[0] == pytest.approx(expected.var(), rel=1e-3)
        following = trainer.collect()
        np.testing.assert_allclose(following["rewards"], 1.0 / np.sqrt(expected.var()), rtol=1e-3)
    finally:
        trainer.close()


@pytest.mark.slow
def test_reward_normalisation_resumes_exactly(tmp_path):
    cfg = tiny_config(normalize_reward=True, total_steps=192)
    train(cfg, tmp_path / "full")
    train(cfg, tmp_path / "cut", stop_at=3)
    state = rd.load_resume_state(tmp_path / "cut" / rd.RESUME_STATE)
    assert state["ret_rms"][2] > 1  # the statistics are in the checkpoint
    train(cfg, tmp_path / "cut", resume=True)
    assert metrics_without_timing(tmp_path / "full") == metrics_without_timing(tmp_path / "cut")
    assert_same_weights(weights(tmp_path / "full"), weights(tmp_path / "cut"))
    plain = tiny_config(total_steps=192)
    train(plain, tmp_path / "plain")
    assert metrics_without_timing(tmp_path / "plain") != metrics_without_timing(tmp_path / "full")


@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_split_update_trains_like_the_fused_one(tmp_path, env_id):
    # --update-graphs split runs each minibatch update as two graphs (gradients; clip + Adam) cut from the fused
    # train step's own code: the same updates in the same order, so the same weights up to last-bit rounding, and
    # bitwise reproducible for a seed like every run (measured: at most 1.5e-8 apart after 8 minibatch updates).
    fused = tiny_config(env_id=env_id, num_minibatches=4, total_steps=64, updates_per_call=1, profile=True)
    split = tiny_config(env_id=env_id, num_minibatches=4, total_steps=64, update_graphs="split", profile=True)
    train(fused, tmp_path / "fused")
    assert train(split, tmp_path / "split").iteration == 2
    train(split, tmp_path / "split-again")
    # Compiled graphs: the learner's log-probabilities (ONNX Runtime acts) and the train step, or the split update's
    # three (prepare, gradients, apply).
    compiles = [json.loads((tmp_path / run / "profile.json").read_text())["sections"]["compile"]["calls"]
                for run in ("fused", "split")]  # fmt: skip
    assert compiles == [2, 4]
    a, b = weights(tmp_path / "fused"), weights(tmp_path / "split")
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=0, atol=1e-6, err_msg=name)
    assert_same_weights(b, weights(tmp_path / "split-again"))
    assert metrics_without_timing(tmp_path / "split") == metrics_without_timing(tmp_path / "split-again")
    fused_rows, split_rows = metrics_without_timing(tmp_path / "fused"), metrics_without_timing(tmp_path / "split")
    for f_row, s_row in zip(fused_rows, split_rows, strict=True):
        for key in ("loss", "pg_loss", "v_loss", "approx_kl", "clipfrac"):
            assert float(s_row[key]) == pytest.approx(float(f_row[key]), rel=1e-4, abs=1e-6), key


@pytest.mark.slow
def test_graph_kernel_fusion_trains_like_the_unfused_graphs(tmp_path, monkeypatch):
    # --graph-kernel true compiles the act and train-step graphs with MindSpore's graph-kernel fusion (AKG): other
    # kernels for the same arithmetic, so the same weights up to rounding, and bitwise reproducible for a seed. The
    # build server's files stay out of the working directory, and the flag is off again for later graphs.
    import mindspore as ms

    from msrl_consistency import compat

    monkeypatch.chdir(tmp_path)
    plain, fused = tiny_config(total_steps=64), tiny_config(total_steps=64, graph_kernel=True)
    train(plain, tmp_path / "plain")
    train(fused, tmp_path / "fused")
    train(fused, tmp_path / "fused-again")
    assert list((Path(compat.graph._graph_kernel_dir) / "akg_kernel_meta").glob("Fused_*.so")), "nothing was fused"
    assert ms.get_context("enable_graph_kernel") is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fused", "fused-again", "plain"]
    a, b = weights(tmp_path / "plain"), weights(tmp_path / "fused")
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=0, atol=1e-5, err_msg=name)
    assert_same_weights(b, weights(tmp_path / "fused-again"))
    assert metrics_without_timing(tmp_path / "fused") == metrics_without_timing(tmp_path / "fused-again")
    assert json.loads((tmp_path / "fused" / rd.RUN_JSON).read_text())["config"]["graph_kernel"] is True


def test_graph_kernel_fusion_says_what_it_needs(monkeypatch):
    from inference.errors import UsageError
    from msrl_consistency import compat

    for bad in (dict(update_precision="fp16"), dict(workers=2), dict(device="gpu")):
        with pytest.raises(UsageError, match="graph-kernel true is measured on the CPU"):
            tiny_config(graph_kernel=True, **bad).validate()
    monkeypatch.setenv("PATH", "")
    assert "g++" in compat.graph_kernel_blocker()


def test_graph_kernel_fusion_creates_a_kernel_directory_the_user_named(tmp_path, monkeypatch):
    # It once failed with "No such file or directory" for an MS_COMPILER_CACHE_PATH that did not exist yet.
    import mindspore as ms

    from msrl_consistency import compat

    named = tmp_path / "kernels" / "here"
    monkeypatch.setattr(compat.graph, "_graph_kernel_dir", None)
    monkeypatch.setenv("MS_COMPILER_CACHE_PATH", str(named))
    cwd = os.getcwd()
    with compat.graph_kernel_fusion():
        assert Path(os.getcwd()) == named and ms.get_context("enable_graph_kernel") is True
    assert os.getcwd() == cwd and ms.get_context("enable_graph_kernel") is False


def test_split_update_refuses_what_it_does_not_run():
    from inference.errors import UsageError

    with pytest.raises(UsageError, match="split runs one process"):
        tiny_config(update_graphs="split", update_precision="fp16").validate()
    with pytest.raises(UsageError, match="split runs one process"):
        tiny_config(update_graphs="split", workers=2).validate()
    with pytest.raises(UsageError, match="fused or split"):
        tiny_config(update_graphs="both").validate()


def test_a_presets_split_update_and_fusion_give_way_to_data_parallel_mixed_precision_and_devices(tmp_path, monkeypatch):
    from msrl_consistency import config
    from msrl_consistency.config import parse_config

    preset = tmp_path / "Pendulum-v1.toml"
    shipped = config.preset_path("Pendulum-v1").read_text()
    assert 'update_graphs = "fused"' in shipped and "graph_kernel = true" in shipped
    preset.write_text(shipped.replace('update_graphs = "fused"', 'update_graphs = "split"'))
    monkeypatch.setattr(config, "preset_path", lambda env_id: preset)
    chosen = parse_config(["--env-id", "Pendulum-v1"])
    assert (chosen.update_graphs, chosen.graph_kernel) == ("split", True)  # the preset's choices
    for flags in (["--workers", "2"], ["--update-precision", "fp16"]):
        cfg = parse_config(["--env-id", "Pendulum-v1", *flags])
        assert (cfg.update_graphs, cfg.graph_kernel) == ("fused", False), flags
    cfg = parse_config(["--env-id", "Pendulum-v1", "--device", "ascend"])
    assert (cfg.update_graphs, cfg.graph_kernel) == ("split", False)
    from inference.errors import UsageError

    with pytest.raises(UsageError, match="graph-kernel true is measured on the CPU"):  # asked for explicitly
        parse_config(["--env-id", "Pendulum-v1", "--workers", "2", "--graph-kernel", "true"])

    with pytest.raises(UsageError, match="split runs one process"):  # asked for explicitly: a clear error
        parse_config(["--env-id", "Pendulum-v1", "--workers", "2", "--update-graphs", "split"])
