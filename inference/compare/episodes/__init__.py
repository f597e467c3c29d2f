"""Seeded episode replay in lockstep (after Gymnasium's ``utils/env_match.py``).

K episodes run as one batch: env ``k`` is reset with ``seed + k``, every step is one batched policy call for
all K episodes, and in stochastic mode step ``t`` uses noise row ``noise[t, k]`` drawn once from a seeded
generator, so every runtime sees identical randomness. Finished episodes are masked, not reset. Observations are
rows of the contract's ``obs_dtype`` (structured for a ``Dict`` observation); a policy that carries state starts
each episode from its ``init`` and the trace records the state it was fed at every step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from inference.bundle import Bundle
from inference.compare.acting import ModePolicy, to_env
from inference.errors import INTERRUPTS

if TYPE_CHECKING:  # Gymnasium is imported when episodes are played, not to read a bundle
    import gymnasium as gym

EPISODE_NOISE_STREAM = 13
DEFAULT_HORIZON = 1000
Policy = ModePolicy  # act(obs rows, noise | None) -> env actions, carrying its state; reset(batch) per episode


@dataclass(frozen=True)
class EnvSource:
    """Where episodes come from: a registered gymnasium id or a team's own env constructor."""

    label: str
    make: Callable[[], gym.Env]
    max_steps: int


def gym_env_source(env_id: str) -> EnvSource:
    """A registered Gymnasium env. An id is only looked up, never imported: Gymnasium's ``module:EnvId`` form would
    import ``module``, and ids come from bundles and golden files, which must not run code (a team's own env is
    ``--env MODULE:FACTORY``, named on the command line). ``UsageError`` for a module prefix or an unknown id."""
    from inference.errors import UsageError

    if ":" in env_id:
        raise UsageError(
            f"env id {env_id!r} names a module to import; env ids are only looked up among the "
            "registered Gymnasium envs: pass your env as --env MODULE:FACTORY to run its code"
        )
    try:
        import gymnasium as gym
    except ImportError:
        raise UsageError("playing episodes needs Gymnasium: pip install gymnasium") from None
    found, label = registered_env_id(env_id)
    if found is None:
        raise UsageError(f"unknown environment id {env_id!r} (not registered with Gymnasium here; a team's own env: "
                         "--env MODULE:FACTORY)")  # fmt: skip
    spec = gym.registry[found]
    return EnvSource(label, lambda: gym.make(spec), int(spec.max_episode_steps or DEFAULT_HORIZON))


def registered_env_id(env_id: str) -> tuple[str | None, str]:
    """The registered id that runs ``env_id`` and how to name it: the id itself, or, for a version Gymnasium has
    deprecated and no longer registers (``Taxi-v3`` in Gymnasium 1.4, which names ``Taxi-v4`` instead), the newest
    registered version of that env, labelled as such. Gymnasium's deprecation is a notice, not a reason to refuse
    the run; the label (in every report) says which version ran. ``(None, env_id)`` when nothing is registered."""
    import gymnasium as gym

    if env_id in gym.registry:
        return env_id, env_id
    try:
        from gymnasium.envs.registration import find_highest_version, get_env_id, parse_env_id

        namespace, name, version = parse_env_id(env_id)
        newest = find_highest_version(namespace, name)
    except Exception:  # noqa: BLE001 - a malformed id, or a Gymnasium without these helpers: not registered
        return None, env_id
    if version is None or newest is None or newest <= version:
        return None, env_id
    successor = get_env_id(namespace, name, newest)
    return successor, f"{successor} (for {env_id}, deprecated in Gymnasium {gym.__version__})"


@dataclass
class EpisodeTrace:
    """Lockstep traces of K episodes; arrays are ``[T, K, ...]`` with ``alive[t, k]`` marking real steps."""

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    alive: np.ndarray
    states: np.ndarray | None = None  # [T, K] rows of the state fed at each step; None: the policy carries none

    @property
    def returns(self) -> np.ndarray:
        return (self.rewards * self.alive).sum(0)

    @property
    def lengths(self) -> np.ndarray:
        return self.alive.sum(0)


def episode_noise(bundle: Bundle, graph: str, episodes: int, max_steps: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng([seed, EPISODE_NOISE_STREAM])
    return bundle.sample_noise(graph, rng, max_steps * episodes).reshape(max_steps, episodes, -1)


def run_episodes(
    env: EnvSource,
    policy: Policy,
    episodes: int,
    seed: int,
    noise: np.ndarray | None,
    follow: EpisodeTrace | None = None,
) -> EpisodeTrace:
    """Each env ``k`` reset with ``seed + k``; ``policy`` acts on the whole batch each step.

    ``follow`` (the reference's trace; only for an env that passed the determinism check) saves env steps, not
    results: while an episode's actions equal the reference's bit for bit, its next observation and reward are
    the reference's (same env, seed and actions), so its env is not stepped. Its env is built at its first
    differing action by replaying the reference's actions up to there. The policy still acts on every step in
    the same batches, so the trace is the one stepping every env would give (on the steps an episode is alive;
    a finished episode's row may hold another stale observation).
    """
    envs: list[gym.Env | None] = [None] * episodes
    contract = policy.contract
    try:
        horizon = noise.shape[0] if noise is not None else env.max_steps
        if follow is None:
            envs = [env.make() for _ in range(episodes)]
            obs = contract.batch_observations([e.reset(seed=seed + k)[0] for k, e in enumerate(envs)])
        else:
            obs = follow.obs[0].copy()
        # The observations go straight into one array of the horizon's size: its pages are committed as steps
        # fill them, so a short episode costs its own steps, and no list of frames is copied into it at the end.
        obs_log = np.empty((horizon, *obs.shape), obs.dtype)
        act_log, rew_log, alive_log, state_log = [], [], [], []
        alive = np.ones(episodes, bool)
        policy.reset(episodes)
        steps = 0
        for t in range(horizon):
            if not alive.any():
                break
            INTERRUPTS.check()
            fed = None if policy.state is None else policy.state.copy()
            actions = np.asarray(policy.act(obs, None if noise is None else noise[t]))
            obs_log[t] = obs
            steps = t + 1
            act_log.append(actions.copy())
            alive_log.append(alive.copy())
            state_log.append(fed)
            rewards = np.zeros(episodes)
            next_obs = obs.copy()
            for k in np.flatnonzero(alive):
                if envs[k] is None and follow is not None and np.array_equal(actions[k], follow.actions[t, k]):
                    rewards[k] = follow.rewards[t, k]
                    if t + 1 < len(follow.obs):
                        next_obs[k] = follow.obs[t + 1, k]  # after a last step: the final observation
                    alive[k] = t + 1 < len(follow.obs) and bool(follow.alive[t + 1, k])
                    continue
                if envs[k] is None:
                    envs[k] = _replay(env, policy, seed + int(k), follow, t, int(k))  # type: ignore[arg-type]
                o, r, term, trunc, _ = envs[k].step(to_env(contract, actions[k]))  # type: ignore[union-attr]
                next_obs[k], rewards[k] = contract.batch_observations([o])[0], r
                if term or trunc:
                    alive[k] = False
            rew_log.append(rewards)
            obs = next_obs
    finally:
        for e in envs:
            if e is not None:
                e.close()
    states = np.asarray(state_log) if contract.states else None
    return EpisodeTrace(obs_log[:steps], np.asarray(act_log), np.asarray(rew_log), np.asarray(alive_log), states)


def _replay(env: EnvSource, policy: Policy, seed: int, follow: EpisodeTrace, steps: int, k: int) -> gym.Env:
    """A fresh env for episode ``k`` brought to step ``steps`` by the reference's own actions."""
    made = env.make()
    obs, _ = made.reset(seed=seed)
    for t in range(steps):
        if not np.array_equal(policy.contract.batch_observations([obs])[0], follow.obs[t, k]):
            made.close()
            raise RuntimeError(f"{env.label} did not replay episode {k} exactly (step {t}); it is not deterministic")
        obs, *_ = made.step(to_env(policy.contract, follow.actions[t, k]))
    return made


def teacher_forced_actions(
    trace: EpisodeTrace, policy: Policy, noise: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray | None]:
    """The actions ``policy`` takes on every observation of ``trace`` (``[T, K, ...]``), and for a policy that
    carries state, the states it was fed (``[T, K]`` rows): its own previous outputs, from its ``init``.

    Step by step, all K episodes as one batch: the batch the reference acted in. A row's outputs move with the size
    of its batch by a few ULP (GEMM blocking), and a sampled action carries that through ``std * noise``; replaying
    the trace in other batches would judge that batch effect instead of the runtime.
    """
    steps, k = trace.alive.shape
    policy.reset(k)
    actions, states = [], []
    for t in range(steps):
        INTERRUPTS.check()
        if policy.contract.states:
            states.append(policy.state.copy())  # type: ignore[union-attr]
        actions.append(np.asarray(policy.act(trace.obs[t], None if noise is None else noise[t])))
    return np.asarray(actions), (np.asarray(states) if policy.contract.states else None)


def check_env_determinism(env: EnvSource, seed: int, steps: int = 200) -> str | None:
    """Same seed and action sequence twice must give the same trajectory; returns why not, or None."""
    traces = []
    for _ in range(2):
        e = env.make()
        try:
            e.action_space.seed(seed)
            obs, _ = e.reset(seed=seed)
            trace = [_flat(obs)]
            for _ in range(steps):
                obs, reward, term, trunc, _ = e.step(e.action_space.sample())
                trace.append(np.append(_flat(obs), reward))
                if term or trunc:
                    obs, _ = e.reset()
                    trace.append(_flat(obs))
        finally:
            e.close()
        traces.append(trace)
    for t, (a, b) in enumerate(zip(*traces, strict=False)):
        if a.shape != b.shape or not np.array_equal(a, b, equal_nan=True):
            return f"{env.label} is not deterministic under a fixed seed: trajectories differ at step {t}"
    return None


def _flat(obs: object) -> np.ndarray:
    """An env observation (an array, or a dict of arrays) as one float64 vector."""
    if isinstance(obs, dict):
        return np.concatenate([_flat(obs[key]) for key in sorted(obs)]) if obs else np.zeros(0)
    return np.asarray(obs, np.float64).ravel().copy()


def step_differences(ref: np.ndarray, got: np.ndarray, discrete: bool) -> np.ndarray:
    """Per (step, episode): 1/0 for discrete actions (any head differs), else the max absolute difference over
    action dims."""
    if discrete:
        differs = ref != got
        return differs.reshape(*differs.shape[:2], -1).any(-1).astype(np.float64)
    diff = np.abs(ref.astype(np.float64) - got.astype(np.float64))
    return diff.reshape(*diff.shape[:2], -1).max(-1)


def action_differences(ref: EpisodeTrace, got: EpisodeTrace, discrete: bool, atol: float) -> dict:
    """Per-step action difference over the steps both traces are alive; first divergent step per episode.

    Also the first step at which the *observations* differ at all: when it comes before the first divergent
    action, the env amplified sub-tolerance action differences (chaotic dynamics), which is not a policy fault.
    """
    steps = min(len(ref.actions), len(got.actions))
    both = ref.alive[:steps] & got.alive[:steps]
    diff = np.where(both, step_differences(ref.actions[:steps], got.actions[:steps], discrete), 0.0)
    diverged = diff > (0.5 if discrete else atol)
    obs_differ = np.zeros(both.shape, bool)
    for t in range(steps):  # step by step: a frame-sized boolean per element of the whole trace is not needed
        obs_differ[t] = np.any((ref.obs[t] != got.obs[t]).reshape(both.shape[1], -1), axis=-1) & both[t]
    episodes = diff.shape[1]
    first = [int(np.argmax(diverged[:, k])) if diverged[:, k].any() else None for k in range(episodes)]
    drift = [int(np.argmax(obs_differ[:, k])) if obs_differ[:, k].any() else None for k in range(episodes)]
    amplified = [f is not None and d is not None and d < f for f, d in zip(first, drift, strict=True)]
    length_mismatch = ref.lengths != got.lengths
    return {
        "per_step_max": diff.max(1),
        "differing_steps": int(diverged.sum()),
        "first_divergent_step": first,
        "first_observation_drift": drift,
        "amplified": amplified,
        "episodes_diverged": int(
            sum(f is not None for f in first) + int(np.sum(length_mismatch & np.array([f is None for f in first])))
        ),
        "return_delta": (got.returns - ref.returns),
    }
