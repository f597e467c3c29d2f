"""``python -m inference.play BUNDLE``: play seeded episodes of the bundle's env with MindSpore Lite.

Deploy side only (NumPy, Gymnasium and Lite, in this process or with ``--isolate`` in the runner process; no
MindSpore): this is how the policy behaves on a 310 box. ``--format auto`` (the default) loads the ``.mindir``
where this Lite reads its version and the ``.ms`` otherwise. Exit codes: 0 ok, 2 bad bundle or arguments (one
``error:`` line), 3 Lite unavailable, 4-6 and 8-10 Lite errors (see ``lite_common``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from inference.bundle import Bundle, BundleError, load_bundle
from inference.compare.acting import to_env
from inference.compare.feeds import finite_rows
from inference.contract import ContractError
from inference.errors import UsageError
from inference.field import Recorder
from inference.lite_client import LiteRunner
from inference.lite_common import LiteRunnerError
from inference.lite_inprocess import LiteModel
from inference.plugins import import_factory
from inference.sdk import FORMATS, open_runner
from inference.spaces import check_env_spaces
from inference.tensors import FeedError

PLAY_NOISE_STREAM = 21


def bundle_env_id(bundle: Bundle) -> str:
    """The env the bundle's policy acts in; a manifest without one cannot be played."""
    env_id = bundle.manifest.get("env_id")
    if not isinstance(env_id, str) or not env_id:
        raise BundleError(f"{bundle.root}/manifest.json has no env_id: cannot tell which env to play")
    return env_id


def env_maker(bundle: Bundle, own_env: str | None = None) -> tuple[str, Callable[[], Any]]:
    """The env to play in, as a label and a constructor: ``own_env`` (``MODULE:FACTORY``, a team's own env) or the
    bundle's env id."""
    if own_env:
        return own_env, import_factory(own_env, "--env")
    env_id = bundle_env_id(bundle)
    return env_id, lambda: make_env(env_id)


def make_env(env_id: str) -> Any:
    """A Gymnasium env; a missing Gymnasium or an unknown env id is a usage error (BundleError, exit 2)."""
    try:
        import gymnasium as gym
    except ImportError:
        raise BundleError("playing episodes needs Gymnasium: pip install gymnasium") from None
    try:
        return gym.make(env_id)
    except Exception as exc:  # noqa: BLE001 - gymnasium raises several kinds for unknown or broken envs
        raise BundleError(f"cannot make env {env_id!r}: {str(exc).splitlines()[0] if str(exc) else exc!r}") from None


def mode_graph(bundle: Bundle, stochastic: bool) -> str:
    """The graph that acts in the requested mode (the policy contract decides, see ``Bundle.mode_graph``)."""
    mode = "stochastic" if stochastic else "deterministic"
    graph = bundle.mode_graph(mode)
    if graph is None:
        raise BundleError(f"bundle {bundle.root} has no {mode} graph")
    return graph


def run_episodes(
    runner: LiteModel | LiteRunner,
    bundle: Bundle,
    graph: str,
    episodes: int,
    seed: int,
    stochastic: bool,
    report: Callable[[str], None] | None = None,
    recorder: Recorder | None = None,
    own_env: str | None = None,
) -> list[float]:
    """Returns of ``episodes`` seeded episodes of ``graph`` served by ``runner`` (env seeds seed, seed+1, ...;
    host noise from a seeded stream); the graph's contract turns its outputs into env actions. ``own_env``: a team's
    own env constructor (``MODULE:FACTORY``) instead of the bundle's env id."""
    label, make = env_maker(bundle, own_env)
    contract = bundle.contract(graph)
    probe = make()
    try:
        width = lambda name: bundle.output_shape(graph, name)[-1]  # noqa: E731
        check_env_spaces(contract, probe.observation_space, probe.action_space, width, f"bundle vs env {label}")
    finally:
        probe.close()
    rng = np.random.default_rng([seed, PLAY_NOISE_STREAM])
    returns = []
    for k in range(episodes):
        env = make()
        try:
            obs, _ = env.reset(seed=seed + k)
            if recorder is not None and k:
                recorder.new_episode()
            state = contract.initial_state(1)  # a policy that carries state starts every episode from its init
            total, done, nan_steps = 0.0, False, 0
            while not done:
                rows = contract.batch_observations([obs])
                nan_steps += int(not finite_rows(rows)[0])
                noise = bundle.sample_noise(graph, rng, 1) if stochastic else None
                graph_noise = [noise] if contract.takes_noise else []
                feeds = [*contract.obs_inputs(rows), *graph_noise, *contract.state_inputs(state)]
                outputs = runner.infer(*feeds)
                state = contract.next_state(outputs)
                host = None if contract.takes_noise else noise
                actions = contract.env_action(outputs, host_noise=host)
                obs, reward, terminated, truncated, _ = env.step(to_env(contract, actions[0]))
                total += float(reward)
                done = terminated or truncated
                if recorder is not None:
                    recorder.record(feeds, outputs, actions, reward, done)
        finally:
            env.close()
        if report is not None:
            flag = f"  ({nan_steps} NaN observations!)" if nan_steps else ""
            report(f"episode {k:3d} seed {seed + k}: return {total:.2f}{flag}")
        returns.append(total)
    return returns


def play(
    bundle_dir: str, episodes: int, seed: int, stochastic: bool, fmt: str, device: str, device_id: int,
    record: str | None = None, own_env: str | None = None,
) -> list[float]:  # fmt: skip
    if episodes < 1:
        raise BundleError(f"--episodes must be >= 1, got {episodes}")
    bundle = load_bundle(bundle_dir)
    env_maker(bundle, own_env)  # refuse before starting a runner
    graph = mode_graph(bundle, stochastic)
    runner, loaded, why = open_runner(bundle, graph, fmt, device=device, device_id=device_id)
    where = "in this process" if runner.pid == os.getpid() else "runner process"
    recorder = None if record is None else Recorder(record, bundle, graph, "lite" if where == "in this process" else
                                                    "lite-isolated")  # fmt: skip
    with runner:
        try:
            returns = run_episodes(runner, bundle, graph, episodes, seed, stochastic, report=print, recorder=recorder,
                                   own_env=own_env)  # fmt: skip
        finally:
            if recorder is not None:
                recorder.close()
                print(f"recorded {recorder.steps} steps to {record}")
    mode = "stochastic" if stochastic else "deterministic"
    print(f"mean return {np.mean(returns):.2f} ± {np.std(returns):.2f} over {episodes} episodes "
          f"({mode}, .{loaded} on Lite {runner.lite_version}, {where}: {why})")  # fmt: skip
    return returns


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inference.play", description=__doc__.splitlines()[0])
    p.add_argument("bundle", help="exported bundle directory")
    p.add_argument("--episodes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stochastic", action="store_true", help="sample actions with seeded host noise")
    p.add_argument("--format", default="auto", choices=FORMATS, help="graph file to load in Lite")
    p.add_argument("--device", default="cpu", choices=["cpu", "ascend"])
    p.add_argument("--device-id", type=int, default=0)
    p.add_argument("--record", metavar="DIR", help="record every step (inference.field) for an audit on the "
                   "training box (verify --bundle B --audit DIR)")
    p.add_argument("--env", metavar="MODULE:FACTORY", help="your own env constructor (gymnasium API), instead of the "
                   "bundle's env id")
    p.add_argument("--isolate", action="store_true",
                   help="run Lite in the runner process (a watchdog for untrusted models) instead of this one")
    args = p.parse_args(argv)
    if args.isolate:
        os.environ["MSRL_LITE_ISOLATE"] = "1"
    try:
        play(args.bundle, args.episodes, args.seed, args.stochastic, args.format, args.device, args.device_id,
             args.record, args.env)
    except (BundleError, ContractError, FeedError, LiteRunnerError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
