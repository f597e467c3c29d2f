"""Does overlapping env stepping with acting pay on this machine? Synchronous rollout vs two half pools.

The synchronous loop is the Trainer's: one act call for all ``n`` envs, then one EnvPool step of all ``n``. The
overlapped loop splits the envs into two EnvPool pools A and B and pipelines them: act for A, ``send`` A's actions
(A steps in EnvPool's C++ threads, outside the GIL), act for B while A steps, ``send`` B, ``recv`` A, act for A
while B steps, and so on. Each half still acts on its own current observation with the current policy (no policy
lag, synchronous PPO semantics), but it makes two act calls per vector step instead of one.

Both loops run the real compiled rollout graph (``RolloutPolicy`` through ``compat.CompiledCall``) on the same
shapes as the preset, in one process, rounds interleaved; the table reports the best round of each.

    .venv/bin/python bench/overlap.py --env BipedalWalker-v3 --num-envs 16,32,64 --hidden-sizes 256,256,128
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="BipedalWalker-v3")
    parser.add_argument("--num-envs", default="16,32,64")
    parser.add_argument("--hidden-sizes", default="256,256,128")
    parser.add_argument("--steps", type=int, default=300, help="vector steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--env-threads", type=int, default=0, help="EnvPool threads per pool (0: the default rule)")
    args = parser.parse_args(argv)

    from mindspore import Tensor

    from msrl_consistency import compat
    from msrl_consistency.agent import ActorCritic, PolicySpec, RolloutPolicy
    from msrl_consistency.agent.policy import unpack_rollout
    from msrl_consistency.envs import describe_env
    from msrl_consistency.envs.engines import EnvPoolVectorEnv

    compat.set_device("cpu")
    compat.set_threads(1)
    compat.use_graph_mode()
    info = describe_env(args.env)
    spec = PolicySpec.from_env(info, hidden_sizes=[int(h) for h in args.hidden_sizes.split(",")])
    net = compat.CompiledCall(RolloutPolicy(ActorCritic(spec, seed=1)))
    rng = np.random.default_rng(0)

    def act(obs: np.ndarray) -> np.ndarray:
        noise = spec.sample_noise(rng, len(obs))
        return unpack_rollout(net(Tensor(obs.astype(np.float32)), Tensor(noise)).asnumpy(), spec)[1]

    print(f"{args.env}, hidden {args.hidden_sizes}, {args.steps} vector steps per round, best of {args.rounds}")
    print("| envs | sync: act ms | sync: env ms | sync: step ms | overlapped: step ms | overlapped / sync |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in [int(x) for x in args.num_envs.split(",")]:
        full = EnvPoolVectorEnv(args.env, n, args.env_threads)
        halves = [EnvPoolVectorEnv(args.env, n // 2, args.env_threads) for _ in range(2)]
        obs, _ = full.reset(seed=1)
        half_obs = [h.reset(seed=1 + k * (n // 2))[0] for k, h in enumerate(halves)]
        act(obs), act(half_obs[0])  # compile both shapes
        sync_best = over_best = np.inf
        act_best = env_best = np.inf
        for _ in range(args.rounds):
            t_act = t_env = 0.0
            start = time.perf_counter()
            for _ in range(args.steps):
                t0 = time.perf_counter()
                a = act(obs)
                t1 = time.perf_counter()
                obs = full.step(a)[0]
                t_act, t_env = t_act + t1 - t0, t_env + time.perf_counter() - t1
            sync_best = min(sync_best, (time.perf_counter() - start) / args.steps)
            act_best, env_best = min(act_best, t_act / args.steps), min(env_best, t_env / args.steps)

            start = time.perf_counter()
            pools = [h._pool for h in halves]
            pools[0].send(act(half_obs[0]).astype(halves[0]._act_dtype))
            for _ in range(args.steps):
                pools[1].send(act(half_obs[1]).astype(halves[1]._act_dtype))  # while A steps
                half_obs[0] = halves[0]._finish(pools[0].recv(reset=False, return_info=True))[0]
                pools[0].send(act(half_obs[0]).astype(halves[0]._act_dtype))  # while B steps
                half_obs[1] = halves[1]._finish(pools[1].recv(reset=False, return_info=True))[0]
            halves[0]._finish(pools[0].recv(reset=False, return_info=True))
            over_best = min(over_best, (time.perf_counter() - start) / args.steps)
        print(f"| {n} | {act_best * 1e3:.3f} | {env_best * 1e3:.3f} | {sync_best * 1e3:.3f} | {over_best * 1e3:.3f} "
              f"| {over_best / sync_best:.2f}x |", flush=True)  # fmt: skip
        for e in (full, *halves):
            e.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
