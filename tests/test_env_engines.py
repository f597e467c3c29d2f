"""EnvPool as the training engine: gymnasium's SAME_STEP stream from EnvPool's next-step resets, the same dynamics
as gymnasium from the same states, exact snapshots by replay, backend choice, and a Trainer rollout whose
truncation bootstrap, GAE and episode statistics match a gymnasium replay of the same actions."""

from __future__ import annotations

import pickle
from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from inference.errors import UsageError
from msrl_consistency.envs.engines import EnvPoolVectorEnv, resolve_backend

SAME_STEP = gym.vector.AutoresetMode.SAME_STEP


def set_state(env: gym.Env, obs: np.ndarray) -> None:
    """Put a gymnasium classic-control or Hopper env into the state an EnvPool observation shows."""
    inner, obs = env.unwrapped, np.asarray(obs, np.float64)
    if inner.spec.id.startswith(("CartPole", "MountainCar")):
        inner.state = obs.copy()
    elif inner.spec.id.startswith("Pendulum"):
        inner.state = np.array([np.arctan2(obs[1], obs[0]), obs[2]])
    elif inner.spec.id.startswith("Hopper"):  # obs: qpos without x (nothing depends on x), then qvel
        assert np.abs(obs[5:]).max() < 10.0, "velocities clipped in the observation"
        inner.set_state(np.concatenate([[0.0], obs[:5]]), obs[5:])
    else:
        raise ValueError(inner.spec.id)


class Mirror(gym.Wrapper):
    """A gymnasium env whose every reset starts from the next EnvPool start state of the same env index."""

    def __init__(self, env_id: str, starts: deque) -> None:
        super().__init__(gym.make(env_id))
        self.starts = starts

    def reset(self, **kwargs: Any):
        super().reset(**kwargs)
        start = self.starts.popleft()
        set_state(self.env, start)
        return start.copy(), {}


def envpool_rollout(env_id: str, n: int, actions: list[np.ndarray], seed: int = 3) -> dict[str, Any]:
    """Step the EnvPool adapter through ``actions``; record the stream and each env's start states."""
    envs = EnvPoolVectorEnv(env_id, n)
    obs, _ = envs.reset(seed=seed)
    starts = [deque([obs[i].copy()]) for i in range(n)]
    out: dict[str, list] = {"obs": [], "reward": [], "terminated": [], "truncated": [], "final": []}
    for a in actions:
        obs, reward, terminated, truncated, infos = envs.step(a)
        done = terminated | truncated
        final = np.where(done[:, None], infos["final_obs"], np.nan) if done.any() else np.full_like(obs, np.nan)
        for i in np.flatnonzero(done):
            starts[i].append(obs[i].copy())
        for key, value in zip(out, (obs, reward, terminated, truncated, final), strict=True):
            out[key].append(np.array(value, copy=True))
    envs.close()
    return {**{k: np.stack(v) for k, v in out.items()}, "starts": starts}


def gymnasium_rollout(
    env_id: str, starts: list[deque], actions: list[np.ndarray], resync: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Gymnasium's vector env on the same start states and actions; ``resync`` (EnvPool's observation stream)
    puts every env into EnvPool's state before each step, so that differences are one step's, not compounded."""
    envs = gym.vector.SyncVectorEnv([lambda q=q: Mirror(env_id, q) for q in starts], autoreset_mode=SAME_STEP)
    before, _ = envs.reset()
    out: dict[str, list] = {"obs": [], "reward": [], "terminated": [], "truncated": [], "final": []}
    for t, a in enumerate(actions):
        if resync is not None:
            for i, env in enumerate(envs.envs):
                set_state(env, before[i])
            before = resync[t]
        obs, reward, terminated, truncated, infos = envs.step(a)
        done = terminated | truncated
        final = np.full_like(obs, np.nan)
        for i in np.flatnonzero(done):
            final[i] = infos["final_obs"][i]
        for key, value in zip(out, (obs, reward, terminated, truncated, final), strict=True):
            out[key].append(np.array(value, copy=True))
    envs.close()
    return {k: np.stack(v) for k, v in out.items()}


def scripted_actions(env_id: str, n: int, steps: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    if env_id.startswith("CartPole"):
        return [rng.integers(0, 2, n) for _ in range(steps)]
    if env_id.startswith("Hopper"):
        return [rng.uniform(-1.0, 1.0, (n, 3)).astype(np.float32) for _ in range(steps)]
    return [rng.uniform(-2.0, 2.0, (n, 1)).astype(np.float32) for _ in range(steps)]


# CartPole and Hopper (MuJoCo; random actions end its episodes within ~10-60 steps): whole episodes from the same
# start state. Pendulum near the top amplifies a float32 rounding of its state ~10x per 10 steps, so its envs are
# put into EnvPool's state before every step (one-step agreement); it also has the truncation (200 steps) whose
# final observation the bootstrap needs.
@pytest.mark.parametrize(("env_id", "n", "steps", "obs_tol", "resync"),
                         [("CartPole-v1", 4, 300, 1e-6, False), ("Pendulum-v1", 3, 450, 2e-6, True),
                          ("Hopper-v5", 3, 200, 1e-6, False)])  # fmt: skip
def test_envpool_gives_gymnasiums_same_step_stream_and_dynamics(env_id, n, steps, obs_tol, resync):
    """Same actions from the same states: the same terminations, truncations, rewards and observations (float32
    vs float64 arithmetic; the measured differences are in bench/results/engine_agreement.md), the true final
    observation on the done step and the next episode's first one in the same step, no action lost."""
    actions = scripted_actions(env_id, n, steps)
    ours = envpool_rollout(env_id, n, actions)
    ends = int((ours["terminated"] | ours["truncated"]).sum())
    assert ends >= n, "the script must cross episode boundaries"
    if env_id == "Pendulum-v1":
        assert ours["truncated"][199].all() and ours["truncated"][399].all() and not ours["terminated"].any()
    # the one known difference: EnvPool's Pendulum integrates the angle with the unclipped speed
    clipped = speed_clip_engaged(ours, actions) if env_id == "Pendulum-v1" else np.zeros(ours["reward"].shape, bool)
    ref = gymnasium_rollout(env_id, ours["starts"], actions, ours["obs"] if resync else None)
    np.testing.assert_array_equal(ours["terminated"], ref["terminated"])
    np.testing.assert_array_equal(ours["truncated"], ref["truncated"])
    np.testing.assert_allclose(ours["reward"], ref["reward"], rtol=1e-5, atol=1e-5)
    same = ~clipped
    if env_id == "Pendulum-v1":
        assert clipped.any(), "the script must reach the speed clip"
        assert (np.abs(ours["obs"] - ref["obs"]).max(axis=2)[clipped] > 1e-4).any()
    np.testing.assert_allclose(ours["obs"][same], ref["obs"][same], rtol=0, atol=obs_tol)
    np.testing.assert_allclose(ours["final"][same], ref["final"][same], rtol=0, atol=obs_tol)  # NaN: no episode end


def speed_clip_engaged(ours: dict[str, Any], actions: list[np.ndarray]) -> np.ndarray:
    """[step, env]: Pendulum's unclipped new speed exceeded 8 (gymnasium 1.x: th += clip(thdot) * dt)."""
    prev = np.concatenate([np.stack([s[0] for s in ours["starts"]])[None], ours["obs"][:-1]])
    theta = np.arctan2(prev[..., 1], prev[..., 0])
    new_speed = prev[..., 2] + (15.0 * np.sin(theta) + 3.0 * np.stack(actions)[..., 0]) * 0.05
    return np.abs(new_speed) > 8.0 - 1e-3


@pytest.mark.parametrize(
    ("env_id", "steps"), [("CartPole-v1", 120), ("Pendulum-v1", 260), ("BipedalWalker-v3", 150), ("Hopper-v5", 90)]
)
def test_snapshot_replays_to_the_same_state(env_id, steps):
    """A snapshot taken mid-run (after resets) restores into a fresh pool that continues bitwise the same."""
    envs = EnvPoolVectorEnv(env_id, 3)
    envs.reset(seed=11)
    rng = np.random.default_rng(1)
    space = envs.single_action_space

    def act() -> np.ndarray:
        return rng.integers(0, 2, 3) if envs.discrete else rng.uniform(space.low, space.high, (3, *space.shape))

    for _ in range(steps):
        envs.step(act())
    assert envs._resets.max() > 1 or env_id == "BipedalWalker-v3"
    blobs = envs.get_attr("state_blob")
    script = [act() for _ in range(60)]
    expected = [np.copy(envs.step(a)[0]) for a in script]
    again = EnvPoolVectorEnv(env_id, 3)
    again.set_attr("state_blob", [pickle.loads(pickle.dumps(b)) for b in blobs])
    for a, want in zip(script, expected, strict=True):
        np.testing.assert_array_equal(again.step(a)[0], want)
    envs.close()
    again.close()


def test_snapshot_of_another_env_is_refused():
    blobs = EnvPoolVectorEnv("CartPole-v1", 2)
    blobs.reset(seed=1)
    other = EnvPoolVectorEnv("Pendulum-v1", 2)
    with pytest.raises(UsageError, match="does not match"):
        other.set_attr("state_blob", blobs.get_attr("state_blob"))


def test_backend_resolution():
    assert resolve_backend("CartPole-v1", "auto").name == "envpool"
    assert resolve_backend("BipedalWalker-v3", "auto").name == "envpool"
    assert resolve_backend("Hopper-v5", "auto").name == "envpool"
    assert resolve_backend("Hopper-v4", "auto").name == "gymnasium"  # only the verified ids
    pendulum = resolve_backend("Pendulum-v1", "auto")  # EnvPool has it, with other dynamics: gymnasium
    assert pendulum.name == "gymnasium" and "unclipped speed" in pendulum.reason
    assert "unclipped speed" in resolve_backend("Pendulum-v1", "envpool").reason  # on request, with the caveat
    chain = resolve_backend("msrl/Chain-v0", "auto")  # a user's own env: gymnasium
    assert chain.name == "gymnasium" and "not among the ids" in chain.reason
    assert resolve_backend("CartPole-v1", "gymnasium").name == "gymnasium"
    assert resolve_backend("CartPole-v1", "auto", async_envs=True).name == "gymnasium"
    with pytest.raises(UsageError, match="EnvPool has no msrl/Chain-v0"):
        resolve_backend("msrl/Chain-v0", "envpool")
    with pytest.raises(UsageError, match="async-envs"):
        resolve_backend("CartPole-v1", "envpool", async_envs=True)


class Recording:
    """Wraps the Trainer's vector env and records the env actions it is given."""

    def __init__(self, envs: Any) -> None:
        self.envs, self.actions = envs, []

    def step(self, actions: np.ndarray):
        self.actions.append(np.array(actions, copy=True))
        return self.envs.step(actions)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.envs, name)


def test_trainer_rollout_on_envpool_matches_a_gymnasium_replay(tmp_path):
    """MountainCarContinuous truncates every episode at 999 steps: the rollout's dones, truncation bootstrap
    (gamma * V(true final observation)), GAE and episode statistics equal those of gymnasium replaying the same
    actions from the same states, and the step after a truncation starts the next episode (no step lost)."""
    from msrl_consistency.artifacts import run_dir as rd
    from msrl_consistency.config import TrainConfig
    from msrl_consistency.training.gae import compute_gae
    from msrl_consistency.training.loop import Trainer

    cfg = TrainConfig(
        env_id="MountainCarContinuous-v0",
        num_envs=2,
        num_steps=1000,
        total_steps=2000,
        num_minibatches=2,
        update_epochs=1,
        progress=False,
        eval_episodes=0,
        reward_scale=0.5,
    )
    rd.prepare_new_run_dir(tmp_path / "run")
    trainer = Trainer(cfg, tmp_path / "run")
    assert trainer.backend.name == "envpool"
    rollout = trainer.rollout
    starts = [deque([rollout.obs[i].copy()]) for i in range(2)]
    rollout.envs = recording = Recording(rollout.envs)
    buf = trainer.collect()
    stream = np.concatenate([buf["obs"][1:], rollout.obs[None]])  # the obs each step returned
    for i in range(2):
        starts[i].append(stream[998, i].copy())
    ref = gymnasium_rollout(cfg.env_id, starts, recording.actions, stream)
    trainer.close()

    dones = ref["terminated"] | ref["truncated"]
    assert ref["truncated"][998].all() and dones.sum() == 2
    np.testing.assert_array_equal(buf["dones"], dones)
    np.testing.assert_allclose(stream, ref["obs"], rtol=0, atol=1e-6)  # step 999 holds the next episode's start
    bootstrap = cfg.gamma * rollout.values(ref["final"][998].astype(np.float32))
    expected_rewards = (ref["reward"] * cfg.reward_scale).astype(np.float32)
    expected_rewards[998] += bootstrap
    np.testing.assert_allclose(buf["rewards"], expected_rewards, rtol=1e-5, atol=1e-6)
    last_value = rollout.values(rollout.obs)
    adv, ret = compute_gae(expected_rewards, buf["values"], dones, last_value, cfg.gamma, cfg.gae_lambda)
    np.testing.assert_allclose(buf["advantages"], adv, rtol=1e-4, atol=1e-5)
    finished = buf["finished"]  # (step, env, return, length)
    np.testing.assert_array_equal(finished[:, :2], [[998, 0], [998, 1]])
    np.testing.assert_array_equal(finished[:, 3], [999, 999])
    np.testing.assert_allclose(finished[:, 2], ref["reward"][:999].sum(axis=0), rtol=1e-5)
