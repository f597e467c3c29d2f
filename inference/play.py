"""``python -m inference.play BUNDLE``: play seeded episodes of the bundle's env with MindSpore Lite.

Deploy side only (NumPy, Gymnasium and the Lite runner; no MindSpore): this is how the policy behaves
on a 310 box. Exit codes: 0 ok, 2 bad bundle or arguments, 3 runner unavailable, 4-10 runner errors.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from inference.bundle import BundleError, load_bundle
from inference.lite_client import LiteRunner, LiteRunnerError

PLAY_NOISE_STREAM = 21


def play(
    bundle_dir: str, episodes: int, seed: int, stochastic: bool, fmt: str, device: str, device_id: int
) -> list[float]:
    import gymnasium as gym

    bundle = load_bundle(bundle_dir)
    mode = "stochastic" if stochastic else "deterministic"
    graph = bundle.mode_graph(mode)
    if graph is None:
        raise BundleError(f"bundle {bundle.root} has no {mode} graph")
    contract = bundle.contract(graph)
    rng = np.random.default_rng([seed, PLAY_NOISE_STREAM])
    returns = []
    with LiteRunner(bundle.file(graph, fmt), device=device, device_id=device_id) as runner:
        for k in range(episodes):
            env = gym.make(bundle.env_id)
            obs, _ = env.reset(seed=seed + k)
            total, done, nan_steps = 0.0, False, 0
            while not done:
                feed = [np.asarray(obs, np.float32)[None]]
                nan_steps += int(np.isnan(feed[0]).any())
                noise = bundle.sample_noise(graph, rng, 1) if stochastic else None
                if contract.takes_noise:
                    outputs = runner.infer(*feed, noise)
                    action = contract.env_action(outputs)[0]
                else:
                    action = contract.env_action(runner.infer(*feed), host_noise=noise)[0]
                discrete = contract.action.is_discrete
                obs, reward, terminated, truncated, _ = env.step(int(action) if discrete else action)
                total += float(reward)
                done = terminated or truncated
            env.close()
            flag = f"  ({nan_steps} NaN observations!)" if nan_steps else ""
            print(f"episode {k:3d} seed {seed + k}: return {total:.2f}{flag}")
            returns.append(total)
    print(f"mean return {np.mean(returns):.2f} ± {np.std(returns):.2f} over {episodes} episodes "
          f"({'stochastic' if stochastic else 'deterministic'}, {fmt}, Lite {runner.lite_version})")  # fmt: skip
    return returns


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inference.play", description=__doc__.splitlines()[0])
    p.add_argument("bundle", help="exported bundle directory")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stochastic", action="store_true", help="sample actions with seeded host noise")
    p.add_argument("--format", default="ms", choices=["ms", "mindir"], help="graph file to load in Lite")
    p.add_argument("--device", default="cpu", choices=["cpu", "ascend"])
    p.add_argument("--device-id", type=int, default=0)
    args = p.parse_args(argv)
    try:
        play(args.bundle, args.episodes, args.seed, args.stochastic, args.format, args.device, args.device_id)
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except LiteRunnerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
