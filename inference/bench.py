"""``python -m inference.bench BUNDLE``: latency, throughput, soak and task return of a policy as it is deployed.

In the manner of Lite's own ``benchmark`` tool, but for policies and through the deployed path: every request is a
``Policy.act`` call (``inference.load``: the checks on what is passed, the runtime, the env action, the answer
copied out for the caller), on the runtime ``--runtime`` chooses (default ``best``: Lite in this process, else ONNX
Runtime, else the Lite runner process; one line on stderr says which and why). Per batch size, ``--warmup`` untimed
then ``--loops`` timed requests, reported as request latency p50/p99/p99.9, latency per observation and
observations per second. ``--baseline onnxruntime`` times the same policy on ONNX Runtime on the same observations
and thread count, batch by batch alternately (the machine's load then weighs on both alike), and reports the
ratios. ``--soak N`` sends N single-observation requests cycling over a fixed set of seeded observations and
reports the RSS of the process the graph runs in over time and any bitwise drift of the answers to repeated
inputs. ``--episodes`` plays seeded episodes (``inference.play``) for the task figure. Prints a table and writes
JSON (``--json``). No timing is asserted anywhere: these are measurements.

Exit codes: 0 done, 2 bad arguments or bundle (one ``error:`` line), 3 no runtime can run the policy here (or it
failed while acting), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle import LITE_FORMATS, Bundle, BundleError, load_bundle
from inference.bundle.contract import ContractError
from inference.bundle.tensors import FeedError
from inference.compare.feeds import seeded_feeds
from inference.errors import EXIT_USAGE, MsrlError, describe, run_cli
from inference.lite.common import DEFAULT_MAX_ROWS, LiteRunnerError
from inference.lite.runner_info import runner_info
from inference.machine.procfs import status_mb
from inference.play import DEPLOY_EXIT_CODES, episode_env, run_episodes
from inference.policy import Policy
from inference.runtimes.serving import RUNTIMES

SCHEMA = "msrl-consistency/bench"
DEFAULT_BATCHES = "1,8,64,256,1024"
PERCENTILES = (50.0, 99.0, 99.9)


def rss_mb(pid: int | None) -> float | None:
    """Resident set size of a process in MiB (Linux /proc), None if it cannot be read."""
    return None if pid is None else status_mb("VmRSS", pid)


def seeded_observations(bundle: Bundle, rows: int, seed: int) -> np.ndarray:
    """``rows`` seeded observations from the bundle alone: around its normalisation statistics (the states the policy
    was trained on), as rows of the contract's observation dtype (structured for a ``Dict`` observation)."""
    return seeded_feeds(bundle, rows, seed).obs


def _percentiles(seconds: np.ndarray) -> dict[str, float]:
    return {f"p{p:g}_us": float(np.percentile(seconds, p) * 1e6) for p in PERCENTILES}


def bench_batches(
    bundle: Bundle, policies: list[Policy], batches: list[int], warmup: int, loops: int, seed: int
) -> list[list[dict[str, Any]]]:
    """Each batch size timed on each policy in turn (the same observations); one list of rows per policy."""
    pool = seeded_observations(bundle, max(batches) * 4, seed)
    rows: list[list[dict[str, Any]]] = [[] for _ in policies]
    for batch in batches:
        feeds = [np.ascontiguousarray(pool[k * batch : (k + 1) * batch]) for k in range(4)]
        for policy, policy_rows in zip(policies, rows, strict=True):
            policy.reset()  # a carried state restarts at each batch size
            policy_rows.append(time_batch(policy.act, feeds, warmup, loops))
    return rows


def time_batch(act: Callable[[np.ndarray], Any], feeds: list[np.ndarray], warmup: int, loops: int) -> dict[str, Any]:
    """``warmup`` untimed then ``loops`` timed calls of ``act`` cycling over ``feeds``."""
    for i in range(warmup):
        act(feeds[i % 4])
    lat = np.empty(loops)
    start = time.perf_counter()
    for i in range(loops):
        t = time.perf_counter()
        act(feeds[i % 4])
        lat[i] = time.perf_counter() - t
    wall = time.perf_counter() - start
    batch = len(feeds[0])
    row: dict[str, Any] = {"batch": batch, "requests": loops, **_percentiles(lat)}
    row["per_obs_p50_us"] = row["p50_us"] / batch
    row["obs_per_s"] = batch * loops / wall
    return row


def soak(policy: Any, requests: int, distinct: int, seed: int) -> dict[str, Any]:
    """N single-observation requests (``policy.act_outputs``) over ``distinct`` fixed observations; every repeat must
    give bitwise the same action and outputs."""
    pool = seeded_observations(policy.bundle, distinct, seed + 1)
    init = policy.contract.initial_state(1)  # a carried state: every request starts from the init
    first: list[dict[str, bytes] | None] = [None] * distinct
    first_arrays: list[dict[str, np.ndarray] | None] = [None] * distinct
    drifted, max_abs = 0, 0.0
    every = max(1, requests // 50)
    model = policy.model
    samples: list[tuple[int, float | None]] = [(0, rss_mb(model.pid))]
    lat = np.empty(requests)
    restarts_before = model.restarts
    start = time.perf_counter()
    for i in range(requests):
        k = i % distinct
        t = time.perf_counter()
        action, out = policy.act_outputs(pool[k : k + 1], state=init)
        lat[i] = time.perf_counter() - t
        out = {**out, "(action)": action}
        if first[k] is None:
            first[k] = {name: a.tobytes() for name, a in out.items()}
            first_arrays[k] = out
        elif any(a.tobytes() != first[k][name] for name, a in out.items()):  # type: ignore[index]
            drifted += 1
            ref = first_arrays[k]
            assert ref is not None
            for name, a in out.items():
                if a.dtype.kind == "f":
                    max_abs = max(max_abs, float(np.nanmax(np.abs(a.astype(np.float64) - ref[name]))))
        if (i + 1) % every == 0:
            samples.append((i + 1, rss_mb(model.pid)))
    wall = time.perf_counter() - start
    rss = [r for _, r in samples if r is not None]
    return {
        "requests": requests,
        "distinct_inputs": distinct,
        "seconds": wall,
        "requests_per_s": requests / wall if wall > 0 else None,
        **_percentiles(lat),
        "drifted_requests": drifted,
        "drift_max_abs": max_abs,
        "rss_mb_start": rss[0] if rss else None,
        "rss_mb_end": rss[-1] if rss else None,
        "rss_mb_max": max(rss) if rss else None,
        "rss_samples": [{"request": n, "rss_mb": r} for n, r in samples],
        "runner_restarts": model.restarts - restarts_before,
    }


def parse_batches(text: str) -> list[int]:
    try:
        batches = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise BundleError(f"--batch must be comma-separated integers, got {text!r}") from None
    if not batches or any(b < 1 or b > DEFAULT_MAX_ROWS for b in batches):
        raise BundleError(f"--batch sizes must be within 1-{DEFAULT_MAX_ROWS}, got {text!r}")
    return batches


def where(result: dict[str, Any]) -> str:
    """Where the graph ran, as the table's header says it."""
    if result["runtime"] == "onnxruntime":
        return "(ONNX Runtime) in this process"
    if not result["lite_in_process"]:
        return "in the runner process"
    return "in this process, on the calling thread" if result.get("lite_inline") else "in this process"


def render(result: dict[str, Any]) -> str:
    engine = f"Lite {result['lite_version']}" if result["runtime"] != "onnxruntime" else "ONNX Runtime"
    lines = [
        f"{result['env_id']} {result['graph']} ({result['file']}: {result['runtime_reason']})",
        f"Policy.act on {engine} {where(result)}, {result['threads']} thread(s), {result['warmup']} warm-up + "
        f"{result['loops']} timed requests per batch size",
        "",
        "| batch | p50 µs | p99 µs | p99.9 µs | per obs p50 µs | obs/s |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["batches"]:
        lines.append(
            f"| {r['batch']} | {r['p50_us']:.1f} | {r['p99_us']:.1f} | {r['p99.9_us']:.1f} | "
            f"{r['per_obs_p50_us']:.2f} | {r['obs_per_s']:,.0f} |"
        )
    b = result.get("baseline")
    if b:
        lines += [
            "",
            f"baseline: ONNX Runtime {b['version']} on {Path(b['file']).name}, the same feeds and thread count, timed "
            "batch by batch alternately with Lite",
            "",
            "| batch | Lite p50 µs | ORT p50 µs | p50 / ORT | Lite p99 µs | ORT p99 µs | p99 / ORT | obs/s / ORT |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r, o in zip(result["batches"], b["batches"], strict=True):
            lines.append(
                f"| {r['batch']} | {r['p50_us']:.1f} | {o['p50_us']:.1f} | {r['p50_us'] / o['p50_us']:.2f}x | "
                f"{r['p99_us']:.1f} | {o['p99_us']:.1f} | {r['p99_us'] / o['p99_us']:.2f}x | "
                f"{r['obs_per_s'] / o['obs_per_s']:.2f}x |"
            )
    s = result.get("soak")
    if s:
        lines += [
            "",
            f"soak: {s['requests']:,} requests over {s['distinct_inputs']} repeated inputs in {s['seconds']:.1f} s "
            f"(p50 {s['p50_us']:.1f} µs, p99 {s['p99_us']:.1f} µs, p99.9 {s['p99.9_us']:.1f} µs); Lite's process RSS "
            f"{s['rss_mb_start']:.1f} -> {s['rss_mb_end']:.1f} MiB (max {s['rss_mb_max']:.1f}); bitwise drift: "
            f"{s['drifted_requests']} requests (max |diff| {s['drift_max_abs']:.3g}); restarts {s['runner_restarts']}",
        ]
    e = result.get("episodes")
    if e:
        lines += [
            "",
            f"task: mean return {e['mean_return']:.2f} ± {e['std_return']:.2f} over {e['episodes']} seeded episodes "
            f"(seeds {e['seed']}..{e['seed'] + e['episodes'] - 1}, {e['mode']})",
        ]
    return "\n".join(lines)


def _mode(bundle: Any, args: argparse.Namespace) -> str:
    """The mode asked for, or the one the graph named by ``--graph`` acts in."""
    mode = "stochastic" if args.stochastic else "deterministic"
    if args.graph is not None:
        bundle.graph(args.graph)  # an unknown graph name is a one-line BundleError
        modes = [m for m in ("deterministic", "stochastic") if bundle.mode_graph(m) == args.graph]
        if not modes:
            raise BundleError(f"bundle {bundle.root}: graph {args.graph!r} acts in no mode")
        mode = mode if mode in modes else modes[0]
    return mode


def run(args: argparse.Namespace) -> dict[str, Any]:
    from inference.machine.facts import environment

    for name, value, low in (("--loops", args.loops, 1), ("--warmup", args.warmup, 0), ("--soak", args.soak, 0),
                             ("--episodes", args.episodes, 0), ("--threads", args.threads, 1),
                             ("--soak-inputs", args.soak_inputs, 1)):  # fmt: skip
        if value < low:
            raise BundleError(f"{name} must be >= {low}, got {value}")
    batches = parse_batches(args.batch)
    if not Path(args.bundle).exists():
        raise BundleError(f"bundle {args.bundle} does not exist")
    bundle = load_bundle(args.bundle)
    mode = _mode(bundle, args)
    env = episode_env(bundle, args.env) if args.episodes else None  # refused before any runtime starts
    options = {"device": args.device, "device_id": args.device_id, "threads": args.threads}
    baseline = None
    if args.baseline:  # a bundle without a usable ONNX graph is refused before Lite loads
        if args.device != "cpu":
            raise BundleError("--baseline onnxruntime runs on the CPU: use it with --device cpu")
        try:
            bundle.file(bundle.mode_graph(mode) or "", "onnx")
        except BundleError as exc:
            raise BundleError(f"--baseline onnxruntime: {exc}") from None
        baseline = Policy(bundle, mode, "onnxruntime", args.seed, threads=args.threads)
    policy = Policy(bundle, mode, args.runtime, args.seed, fmt=args.format, **options)
    print(f"acting with {policy.runtime}: {policy.runtime_reason}", file=sys.stderr, flush=True)
    info = runner_info()
    model = policy.model
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "schema_version": 2,
        "bundle": str(bundle.root),
        "env_id": bundle.env_id,
        "graph": policy.graph,
        "mode": mode,
        "runtime": policy.runtime,
        "runtime_reason": policy.runtime_reason,
        "file": policy.file.name,
        "format": policy.file.suffix.lstrip("."),
        "lite_version": getattr(model, "lite_version", None),
        "lite_sdk": info.record if info else None,
        "lite_in_process": policy.runtime == "lite",
        "runner": str(model.runner) if hasattr(model, "runner") else None,  # Lite's library or runner executable
        "device": args.device,
        "threads": args.threads,
        "warmup": args.warmup,
        "loops": args.loops,
        "environment": {
            k: v
            for k, v in environment(None if info is None else info.summary()).items()
            if k in ("python", "numpy", "machine", "cpu_model", "simd")
        },  # fmt: skip
    }
    with policy:
        timed = bench_batches(bundle, [policy] if baseline is None else [policy, baseline], batches, args.warmup,
                              args.loops, args.seed)  # fmt: skip
        result["batches"] = timed[0]
        result["lite_inline"] = bool(getattr(model, "runs_inline", False))  # the graph ran on this thread
        if baseline is not None:
            result["baseline"] = {"runtime": "onnxruntime", "version": baseline.model.version,
                                  "file": str(baseline.file), "batches": timed[1]}  # fmt: skip
            baseline.close()
        if args.soak:
            policy.reset()
            result["soak"] = soak(policy, args.soak, args.soak_inputs, args.seed)
        if env is not None:
            with Policy(bundle, mode, args.runtime, args.seed, fmt=args.format, **options) as player:
                returns = run_episodes(player, env, args.episodes, args.seed)
            result["episodes"] = {
                "episodes": args.episodes,
                "seed": args.seed,
                "mode": mode,
                "returns": returns,
                "mean_return": float(np.mean(returns)),
                "std_return": float(np.std(returns)),
            }
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m inference.bench", description=__doc__.splitlines()[0],
                                epilog=DEPLOY_EXIT_CODES)  # fmt: skip
    p.add_argument("bundle", help="exported bundle directory")
    p.add_argument("--graph", help="graph to time (default: the graph that acts in the mode: --stochastic or not)")
    p.add_argument(
        "--runtime",
        default="best",
        choices=RUNTIMES,
        help="best: Lite in this process, else ONNX Runtime, else the Lite runner process",
    )
    p.add_argument("--format", default="auto", choices=LITE_FORMATS, help="graph file to load in Lite")
    p.add_argument("--batch", default=DEFAULT_BATCHES, help=f"batch sizes (default {DEFAULT_BATCHES})")
    p.add_argument("--warmup", type=int, default=50, help="untimed requests per batch size")
    p.add_argument("--loops", type=int, default=1000, help="timed requests per batch size")
    p.add_argument("--threads", type=int, default=1, help="runtime CPU threads")
    p.add_argument("--device", default="cpu", choices=["cpu", "ascend"])
    p.add_argument("--device-id", type=int, default=0)
    p.add_argument(
        "--isolate",
        action="store_true",
        help="run Lite in the runner process (a watchdog for untrusted models): --runtime lite-isolated",
    )
    p.add_argument(
        "--baseline",
        choices=["onnxruntime"],
        help="also time the policy on ONNX Runtime, batch by batch alternately with the runtime",
    )
    p.add_argument("--soak", type=int, default=0, metavar="N", help="N single-observation soak requests")
    p.add_argument("--soak-inputs", type=int, default=64, help="distinct inputs the soak cycles over")
    p.add_argument("--episodes", type=int, default=10, help="seeded episodes for the task figure (0: skip)")
    p.add_argument("--stochastic", action="store_true", help="act with seeded noise (the sampling graph)")
    p.add_argument(
        "--env",
        metavar="MODULE:FACTORY",
        help="your own env constructor for the episodes (gymnasium API), instead of the bundle's env id",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="bench.json", help="where to write the JSON result (default bench.json)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.isolate:
        args.runtime = "lite-isolated"
    try:
        result = run(args)
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    except (LiteRunnerError, MsrlError, BundleError, ContractError, FeedError) as exc:  # errors.describe's rule
        message, code = describe(exc)
        print(f"error: {message}", file=sys.stderr)
        return code
    except OSError as exc:
        print(f"error: cannot write {args.json}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    print(render(result))
    print(f"\nwritten: {args.json}")
    return 0


def cli() -> None:
    """``python -m inference.bench``: Ctrl-C exits 130."""
    run_cli(main)


if __name__ == "__main__":
    cli()
