"""``python -m inference.play BUNDLE``: play seeded episodes of the bundle's env, acting through ``inference.load``.

Deploy side only (NumPy, Gymnasium and a runtime: Lite in this process by default; no MindSpore): this is how the
policy behaves on a 310 box. The policy acts through ``Policy`` (``inference.policy``), exactly as a team's own
control loop does; ``--runtime`` chooses the runtime (default ``best``: Lite in this process, else ONNX Runtime,
else the Lite runner process) and one line on stderr says which one acts and why. The env is the bundle's
registered Gymnasium id, or ``--env MODULE:FACTORY``: only code named on the command line runs.

Exit codes: 0 ok, 2 bad bundle or arguments (one ``error:`` line), 3 no runtime can run the policy here (or the
runtime failed while acting), 130 interrupted (a recording is finished first).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from inference.bundle import LITE_FORMATS, Bundle, BundleError, load_bundle
from inference.bundle.contract import ContractError
from inference.bundle.spaces import check_env_spaces
from inference.bundle.tensors import FeedError
from inference.compare.acting import to_env
from inference.compare.episodes import EnvSource
from inference.compare.feeds import finite_rows
from inference.compare.inputs import env_factory_source, env_source
from inference.errors import MsrlError, describe, run_cli
from inference.lite.common import LiteRunnerError
from inference.policy import Policy
from inference.runtimes.serving import RUNTIMES

DEPLOY_EXIT_CODES = ("exit codes: 0 ok, 2 bad bundle or arguments, 3 no runtime can run the policy here (or it failed "
                     "while acting), 130 interrupted")  # fmt: skip


def episode_env(bundle: Bundle, own_env: str | None = None) -> EnvSource:
    """The env to play in: ``own_env`` (``MODULE:FACTORY``, a team's own env, named on the command line) or the
    bundle's registered Gymnasium id (looked up, never imported)."""
    if own_env:
        return env_factory_source(own_env)
    env_id = bundle.env_id
    if not isinstance(env_id, str) or not env_id:
        raise BundleError(f"{bundle.root}/manifest.json has no env_id: cannot tell which env to play (pass --env "
                          "MODULE:FACTORY)")  # fmt: skip
    return env_source(env_id)


def check_env(policy: Policy, env: EnvSource) -> None:
    """The env's spaces are the ones the policy's contract describes (one line otherwise, before any step)."""
    probe = env.make()
    try:
        width = lambda name: policy.bundle.output_shape(policy.graph, name)[-1]  # noqa: E731
        check_env_spaces(policy.contract, probe.observation_space, probe.action_space, width,
                         f"bundle vs env {env.label}")  # fmt: skip
    finally:
        probe.close()


def run_episodes(
    policy: Policy, env: EnvSource, episodes: int, seed: int, report: Callable[[str], None] | None = None
) -> list[float]:
    """Returns of ``episodes`` seeded episodes (env seeds seed, seed+1, ...) acted by ``policy``; each step's reward
    and end go to ``policy.observe`` (a recording's episodes and returns)."""
    check_env(policy, env)
    returns = []
    for k in range(episodes):
        made = env.make()
        try:
            obs, _ = made.reset(seed=seed + k)
            policy.reset()  # a policy that carries state starts every episode from its init
            total, done, nan_steps = 0.0, False, 0
            while not done:
                nan_steps += int(not finite_rows(policy.contract.batch_observations([obs]))[0])
                action = policy.act(obs)
                obs, reward, terminated, truncated, _ = made.step(to_env(policy.contract, action))
                total += float(reward)
                done = bool(terminated or truncated)
                policy.observe(reward, done)
        finally:
            made.close()
        if report is not None:
            flag = f"  ({nan_steps} NaN observations!)" if nan_steps else ""
            report(f"episode {k:3d} seed {seed + k}: return {total:.2f}{flag}")
        returns.append(total)
    return returns


def play(
    bundle_dir: str, episodes: int, seed: int, stochastic: bool, fmt: str = "auto", runtime: str = "best",
    record: str | None = None, own_env: str | None = None, **options: Any,
) -> list[float]:  # fmt: skip
    if episodes < 1:
        raise BundleError(f"--episodes must be >= 1, got {episodes}")
    bundle = load_bundle(bundle_dir)
    env = episode_env(bundle, own_env)  # refused before any runtime starts
    mode = "stochastic" if stochastic else "deterministic"
    with Policy(bundle, mode, runtime, seed, record, fmt=fmt, **options) as policy:
        print(f"acting with {policy.runtime}: {policy.runtime_reason}", file=sys.stderr, flush=True)
        returns = run_episodes(policy, env, episodes, seed, report=print)
    if policy.recorder is not None:  # closed: every step is on disk (a failed write raised instead)
        print(f"recorded {policy.recorder.steps} steps to {record}", file=sys.stderr)
    print(f"mean return {np.mean(returns):.2f} ± {np.std(returns):.2f} over {episodes} episodes "
          f"({mode}, {policy.runtime_reason})")  # fmt: skip
    return returns


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m inference.play", description=__doc__.splitlines()[0],
                                epilog=DEPLOY_EXIT_CODES)  # fmt: skip
    p.add_argument("bundle", help="exported bundle directory")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stochastic", action="store_true", help="sample actions with seeded noise")
    p.add_argument(
        "--runtime",
        default="best",
        choices=RUNTIMES,
        help="best: Lite in this process, else ONNX Runtime, else the Lite runner process",
    )
    p.add_argument("--format", default="auto", choices=LITE_FORMATS, help="graph file to load in Lite")
    p.add_argument("--device", default="cpu", choices=["cpu", "ascend"])
    p.add_argument("--device-id", type=int, default=0)
    p.add_argument(
        "--record",
        metavar="DIR",
        help="record every step (inference.field) for an audit on the training box (verify --bundle B --audit DIR)",
    )
    p.add_argument(
        "--env",
        metavar="MODULE:FACTORY",
        help="your own env constructor (gymnasium API), instead of the bundle's env id",
    )
    p.add_argument(
        "--isolate",
        action="store_true",
        help="run Lite in the runner process (a watchdog for untrusted models): --runtime lite-isolated",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    runtime = "lite-isolated" if args.isolate else args.runtime
    try:
        play(
            args.bundle,
            args.episodes,
            args.seed,
            args.stochastic,
            args.format,
            runtime,
            args.record,
            args.env,
            device=args.device,
            device_id=args.device_id,
        )
    except (LiteRunnerError, MsrlError, BundleError, ContractError, FeedError) as exc:  # errors.describe's rule
        message, code = describe(exc)
        print(f"error: {message}", file=sys.stderr)
        return code
    return 0


def cli() -> None:
    """``python -m inference.play``: Ctrl-C finishes a recording and exits 130."""
    run_cli(main)


if __name__ == "__main__":
    cli()
