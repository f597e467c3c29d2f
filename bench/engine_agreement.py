"""Do EnvPool and gymnasium run the same envs? Per env: one-step agreement from the same state, whole episodes
from the same start state, and (with ``--runs``) trained policies evaluated on both engines.

* one step: before every step the gymnasium env is put into the state EnvPool's observation shows, both take
  the same random action; max |Δobs|, max |Δreward|, termination disagreements over ``--steps`` steps. MuJoCo
  observations omit the x position (rewards and dynamics do not depend on it) and clip velocities to ±10: steps
  from a clipped observation are not comparable and are skipped (counted in the table).
* episodes: gymnasium starts from EnvPool's start state and both take the same random actions for the whole
  episode; the max |Δobs| shows how float32/float64 rounding compounds (chaotic envs amplify it).
* statistics (``--statistics ENVS``): each engine's return, length and termination share under random actions, for
  envs whose state cannot be set from EnvPool's (Box2D); mean ± standard error.
* policies (``--runs DIR ...``, run dirs trained on EnvPool): deterministic returns on gymnasium (the deploy
  side's env, what ``Trainer.evaluate``, verify and play use) and on EnvPool, from the same start states for
  classic control; for Box2D (terrain from each engine's own RNG) from their own seeded starts.

    .venv/bin/python bench/engine_agreement.py --runs runs/cp runs/bw --out bench/results/engine_agreement.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from msrl_consistency.envs.engines import EnvPoolVectorEnv  # noqa: E402

CLASSIC = ("CartPole-v1", "MountainCar-v0", "MountainCarContinuous-v0", "Acrobot-v1", "Pendulum-v1")
# MuJoCo envs whose observation is (qpos without x, qvel clipped to ±10): their state can be set from it.
MUJOCO = ("Hopper-v5", "Walker2d-v5", "HalfCheetah-v5")
SAME_STARTS = CLASSIC + MUJOCO  # envs a gymnasium env can be started in EnvPool's start state


def to_state(env_id: str, obs: np.ndarray) -> np.ndarray:
    obs = np.asarray(obs, np.float64)
    if env_id.startswith("Acrobot"):
        return np.array([np.arctan2(obs[1], obs[0]), np.arctan2(obs[3], obs[2]), obs[4], obs[5]])
    if env_id.startswith("Pendulum"):
        return np.array([np.arctan2(obs[1], obs[0]), obs[2]])
    return obs.copy()


def put_in_state(g: gym.Env, env_id: str, obs: np.ndarray) -> bool:
    """Put gymnasium's env into the state EnvPool's observation shows; False if the observation does not show it."""
    if env_id in MUJOCO:
        inner, obs = g.unwrapped, np.asarray(obs, np.float64)
        nq = inner.model.nq
        qvel = obs[nq - 1 :]
        if np.abs(qvel).max() >= 10.0:  # clipped in the observation: the true velocity is unknown
            return False
        inner.set_state(np.concatenate([[0.0], obs[: nq - 1]]), qvel)
        return True
    g.unwrapped.state = to_state(env_id, obs)
    return True


def random_actions(space: gym.Space, rng: np.random.Generator, n: int) -> np.ndarray:
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(0, space.n, n)
    return rng.uniform(space.low, space.high, (n, *space.shape)).astype(np.float32)


def one_step(env_id: str, steps: int, n: int = 4) -> dict[str, Any]:
    pool = EnvPoolVectorEnv(env_id, n)
    obs, _ = pool.reset(seed=1)
    gyms = [gym.make(env_id) for _ in range(n)]
    for g in gyms:
        g.reset(seed=0)
    rng = np.random.default_rng(0)
    d_obs = d_rew = 0.0
    flags = skipped = 0
    for _ in range(steps // n):
        a = random_actions(pool.single_action_space, rng, n)
        prev = obs.copy()
        obs, r, term, trunc, info = pool.step(a)
        final = info.get("final_obs", obs)
        for i, g in enumerate(gyms):
            g.reset(seed=0)  # clears gymnasium's "stepped after termination" bookkeeping
            if not put_in_state(g, env_id, prev[i]):
                skipped += 1
                continue
            go, gr, gterm, _, _ = g.step(int(a[i]) if pool.discrete else a[i])
            d_obs, d_rew = max(d_obs, float(np.abs(go - final[i]).max())), max(d_rew, abs(float(gr) - float(r[i])))
            flags += int(bool(gterm) != bool(term[i]))
    pool.close()
    return {"one_step_obs": d_obs, "one_step_reward": d_rew, "termination_disagreements": flags,
            "steps": steps // n * n - skipped, "skipped": skipped}  # fmt: skip


def episodes(env_id: str, count: int) -> dict[str, Any]:
    """Whole episodes from the same start state with the same random actions (no resync)."""
    rng = np.random.default_rng(1)
    worst, lengths_equal, first_big = 0.0, 0, []
    for k in range(count):
        pool = EnvPoolVectorEnv(env_id, 1)
        obs, _ = pool.reset(seed=100 + k)
        g = gym.make(env_id)
        g.reset(seed=0)
        assert put_in_state(g, env_id, obs[0]), "start states are at rest"
        done_p = done_g = False
        t, big = 0, None
        while not (done_p or done_g):
            a = random_actions(pool.single_action_space, rng, 1)
            obs, _, term, trunc, info = pool.step(a)
            final = info.get("final_obs", obs)[0]
            go, _, gterm, gtrunc, _ = g.step(int(a[0]) if pool.discrete else a[0])
            diff = float(np.abs(go - final).max())
            worst = max(worst, diff)
            if big is None and diff > 1e-3:
                big = t
            done_p, done_g = bool(term[0] or trunc[0]), bool(gterm or gtrunc)
            t += 1
        lengths_equal += int(done_p and done_g)
        first_big.append(big)
        pool.close()
    return {"episode_obs": worst, "episodes_same_length": lengths_equal, "episodes": count,
            "first_step_over_1e-3": first_big}  # fmt: skip


def random_statistics(env_id: str, count: int, n: int = 16) -> dict[str, Any]:
    """Each engine's episode statistics under uniform random actions (``count`` episodes of ``n`` envs): for envs whose
    state a gymnasium env cannot be put into (Box2D: EnvPool draws the terrain from its own RNG)."""
    from msrl_consistency.envs.make import make_vector_env

    stats: dict[str, Any] = {}
    for name, envs in (("envpool", EnvPoolVectorEnv(env_id, n)), ("gymnasium", make_vector_env(env_id, n))):
        envs.reset(seed=0)
        rng = np.random.default_rng(0)
        ret, length, ended = np.zeros(n), np.zeros(n, int), []
        while len(ended) < count:
            _, r, term, trunc, _ = envs.step(random_actions(envs.single_action_space, rng, n))
            ret, length = ret + r, length + 1
            for i in np.flatnonzero(term | trunc):
                ended.append((ret[i], length[i], bool(term[i])))
                ret[i], length[i] = 0.0, 0
        envs.close()
        a = np.array(ended[:count], float)
        stats[name] = {"return": a[:, 0].mean(), "return_se": a[:, 0].std() / np.sqrt(count), "length": a[:, 1].mean(),
                       "length_se": a[:, 1].std() / np.sqrt(count), "terminated": a[:, 2].mean()}  # fmt: skip
    return stats


def policy_returns(run_dir: Path, episodes_: int) -> dict[str, Any]:
    from mindspore import Tensor

    from msrl_consistency import compat
    from msrl_consistency.agent import DeterministicPolicy, PolicySpec
    from msrl_consistency.artifacts.checkpoint import load_policy

    info = json.loads((run_dir / "run.json").read_text())
    env_id = info["env_id"]
    compat.use_graph_mode()
    spec = PolicySpec.from_dict(info["policy_spec"])
    det = compat.CompiledCall(DeterministicPolicy(load_policy(run_dir / "checkpoint.ckpt", spec)))

    def act(obs: np.ndarray) -> np.ndarray:
        return det(Tensor(np.asarray(obs, np.float32).reshape(len(obs), -1)))[0].asnumpy()

    pool = EnvPoolVectorEnv(env_id, episodes_)
    obs, _ = pool.reset(seed=20_000)
    starts = obs.copy()
    ret_p, done = np.zeros(episodes_), np.zeros(episodes_, bool)
    while not done.all():
        obs, r, term, trunc, _ = pool.step(act(obs))
        ret_p += np.where(done, 0.0, r)
        done |= term | trunc
    pool.close()
    ret_g = []
    for k in range(episodes_):
        g = gym.make(env_id)
        o, _ = g.reset(seed=20_000 + k)
        if env_id in SAME_STARTS:  # the same start state as EnvPool's episode k
            assert put_in_state(g, env_id, starts[k]), "start states are at rest"
            o = starts[k]
        total, fin = 0.0, False
        while not fin:
            a = act(o[None])[0]
            o, r, term, trunc, _ = g.step(int(a) if spec.discrete else a)
            total, fin = total + float(r), term or trunc
        ret_g.append(total)
    same_start = env_id in SAME_STARTS
    return {"env_id": env_id, "run": str(run_dir), "backend": info["env_backend"]["name"], "same_starts": same_start,
            "envpool_mean": float(ret_p.mean()), "envpool_std": float(ret_p.std()), "gym_mean": float(np.mean(ret_g)),
            "gym_std": float(np.std(ret_g)), "episodes": episodes_,
            "per_episode_max_diff": float(np.abs(ret_p - np.array(ret_g)).max()) if same_start else None}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default=",".join(CLASSIC))
    parser.add_argument("--steps", type=int, default=20_000, help="one-step comparisons per env")
    parser.add_argument("--episodes", type=int, default=20, help="whole episodes per env")
    parser.add_argument("--runs", nargs="*", default=[], help="run dirs of policies trained on EnvPool")
    parser.add_argument("--policy-episodes", type=int, default=20)
    parser.add_argument("--statistics", default="", help="envs to compare by random-action episode statistics")
    parser.add_argument("--statistics-episodes", type=int, default=400)
    parser.add_argument("--out", default="reports/bench/engine_agreement.md")
    args = parser.parse_args(argv)
    mirrored = [e for e in args.envs.split(",") if e]
    lines = ["| env | one step: max abs Δobs | one step: max abs Δreward | termination disagreements | steps "
             "| whole episodes: max abs Δobs | same length | first step with Δobs > 1e-3 |",
             "|---|---:|---:|---:|---:|---:|---:|---|"] if mirrored else []  # fmt: skip
    for env_id in mirrored:
        s, e = one_step(env_id, args.steps), episodes(env_id, args.episodes)
        big = [x for x in e["first_step_over_1e-3"] if x is not None]
        compared = f"{s['steps']:,}" + (f" ({s['skipped']:,} skipped: velocity clipped)" if s["skipped"] else "")
        lines.append(f"| {env_id} | {s['one_step_obs']:.1e} | {s['one_step_reward']:.1e} | "
                     f"{s['termination_disagreements']} | {compared} | {e['episode_obs']:.1e} | "
                     f"{e['episodes_same_length']}/{e['episodes']} | "
                     f"{'never' if not big else f'{len(big)} episodes, from step {min(big)}'} |")  # fmt: skip
        print(lines[-1], flush=True)
    if args.statistics:
        lines += [
            "",
            "| env, random actions | episodes | EnvPool return | gymnasium return | EnvPool length "
            "| gymnasium length | terminated (EnvPool / gymnasium) |",
            "|---|---:|---:|---:|---:|---:|---|",
        ]
        for env_id in [e for e in args.statistics.split(",") if e]:
            st = random_statistics(env_id, args.statistics_episodes)
            p, g = st["envpool"], st["gymnasium"]
            lines.append(
                f"| {env_id} | {args.statistics_episodes} | {p['return']:.1f} ± {p['return_se']:.1f} | "
                f"{g['return']:.1f} ± {g['return_se']:.1f} | {p['length']:.0f} ± {p['length_se']:.0f} | "
                f"{g['length']:.0f} ± {g['length_se']:.0f} | {p['terminated']:.0%} / {g['terminated']:.0%} |"
            )
            print(lines[-1], flush=True)
    if args.runs:
        lines += ["", "| policy | trained on | starts | EnvPool return | gymnasium return | max per-episode Δ |",
                  "|---|---|---|---:|---:|---:|"]  # fmt: skip
        for run in args.runs:
            p = policy_returns(Path(run), args.policy_episodes)
            diff = "–" if p["per_episode_max_diff"] is None else f"{p['per_episode_max_diff']:.2f}"
            starts = "same" if p["same_starts"] else "own seeds"
            lines.append(f"| {p['env_id']} ({Path(run).name}) | {p['backend']} | {starts} | "
                         f"{p['envpool_mean']:.1f} ± {p['envpool_std']:.1f} | {p['gym_mean']:.1f} ± {p['gym_std']:.1f} "
                         f"| {diff} |")  # fmt: skip
            print(lines[-1], flush=True)
    out = REPO / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
