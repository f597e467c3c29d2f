"""``python -m inference.bench BUNDLE``: latency, throughput, soak and task return of a policy on MindSpore Lite.

In the manner of Lite's own ``benchmark`` tool, but for policies and through the deployed path (Lite in this
process, called as ``play`` and ``inference.load`` call it, outputs into reused buffers; ``--isolate``: the runner
process and its pipe): per batch size, ``--warmup`` untimed then ``--loops`` timed requests, reported as request
latency p50/p99/p99.9, latency per observation and observations per second. ``--baseline onnxruntime`` times the
bundle's ONNX graph in ONNX Runtime on the same feeds and thread count, batch by batch alternately with Lite (the
machine's load then weighs on both alike), and reports the ratios. ``--soak N`` sends N single-observation
requests cycling over a fixed set of seeded inputs and reports the RSS of the process Lite runs in over time and
any bitwise drift of the answers to repeated inputs. ``--episodes`` plays seeded episodes through the deployed
model (``inference.play``) for the task figure. Prints a table and writes JSON (``--json``). No timing is asserted
anywhere: these are measurements.

Exit codes: 0 done, 2 bad arguments or bundle (one ``error:`` line), 3-10 Lite errors (see ``lite_common``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle import Bundle, BundleError, load_bundle
from inference.compare.feeds import seeded_feeds
from inference.contract import ContractError
from inference.errors import UsageError
from inference.lite_client import LiteRunner
from inference.lite_common import DEFAULT_MAX_ROWS, LiteRunnerError
from inference.lite_inprocess import LiteModel
from inference.play import mode_graph, run_episodes
from inference.policy import OnnxModel
from inference.procfs import status_mb
from inference.sdk import FORMATS, open_runner, runner_info
from inference.tensors import FeedError

SCHEMA = "msrl-consistency/bench"
DEFAULT_BATCHES = "1,8,64,256,1024"
PERCENTILES = (50.0, 99.0, 99.9)


def rss_mb(pid: int | None) -> float | None:
    """Resident set size of a process in MiB (Linux /proc), None if it cannot be read."""
    return None if pid is None else status_mb("VmRSS", pid)


def seeded_inputs(bundle: Bundle, graph: str, rows: int, seed: int) -> list[np.ndarray]:
    """``rows`` seeded rows of every input ``graph`` takes, from the bundle alone: observations around its
    normalisation statistics (the states the policy was trained on) in the contract's dtypes and keys, the noise of
    a graph that samples inside, and carried states."""
    return seeded_feeds(bundle, rows, seed).graph_inputs(bundle, graph)


def _rows(inputs: list[np.ndarray], lo: int, hi: int) -> list[np.ndarray]:
    return [np.ascontiguousarray(a[lo:hi]) for a in inputs]


def _percentiles(seconds: np.ndarray) -> dict[str, float]:
    return {f"p{p:g}_us": float(np.percentile(seconds, p) * 1e6) for p in PERCENTILES}


def bench_batches(
    bundle: Bundle, graph: str, models: list[Any], batches: list[int], warmup: int, loops: int, seed: int
) -> list[list[dict[str, Any]]]:
    """Each batch size timed on each model in turn (same feeds); one list of rows per model."""
    pool = seeded_inputs(bundle, graph, max(batches) * 4, seed)
    rows: list[list[dict[str, Any]]] = [[] for _ in models]
    for batch in batches:
        feeds = [_rows(pool, k * batch, (k + 1) * batch) for k in range(4)]
        for model, model_rows in zip(models, rows, strict=True):
            model_rows.append(time_batch(getattr(model, "infer_into", model.infer), feeds, warmup, loops))
    return rows


def time_batch(infer: Any, feeds: list[list[np.ndarray]], warmup: int, loops: int) -> dict[str, Any]:
    """``warmup`` untimed then ``loops`` timed calls of ``infer`` cycling over ``feeds``."""
    for i in range(warmup):
        infer(*feeds[i % 4])
    lat = np.empty(loops)
    start = time.perf_counter()
    for i in range(loops):
        t = time.perf_counter()
        infer(*feeds[i % 4])
        lat[i] = time.perf_counter() - t
    wall = time.perf_counter() - start
    batch = len(feeds[0][0])
    row: dict[str, Any] = {"batch": batch, "requests": loops, **_percentiles(lat)}
    row["per_obs_p50_us"] = row["p50_us"] / batch
    row["obs_per_s"] = batch * loops / wall
    return row


def open_baseline(bundle: Bundle, graph: str, threads: int) -> OnnxModel:
    """ONNX Runtime on the bundle's ONNX file of ``graph`` (``--baseline onnxruntime``)."""
    try:
        path = bundle.file(graph, "onnx")  # not exported, or failed at export: a BundleError saying which
    except BundleError as exc:
        raise BundleError(f"--baseline onnxruntime: {exc}") from None
    try:
        return OnnxModel(path, threads)
    except ImportError:
        raise UsageError("--baseline onnxruntime: the onnxruntime package is not installed here") from None


def soak(
    bundle: Bundle, graph: str, runner: LiteModel | LiteRunner, requests: int, distinct: int, seed: int
) -> dict[str, Any]:
    """N single-observation requests over ``distinct`` fixed inputs; every repeat must be bitwise identical."""
    pool = seeded_inputs(bundle, graph, distinct, seed + 1)
    feeds = [_rows(pool, i, i + 1) for i in range(distinct)]
    first: list[dict[str, bytes] | None] = [None] * distinct
    first_arrays: list[dict[str, np.ndarray] | None] = [None] * distinct
    drifted, max_abs = 0, 0.0
    every = max(1, requests // 50)
    samples: list[tuple[int, float | None]] = [(0, rss_mb(runner.pid))]
    lat = np.empty(requests)
    restarts_before = runner.restarts
    start = time.perf_counter()
    for i in range(requests):
        k = i % distinct
        t = time.perf_counter()
        out = runner.infer(*feeds[k])
        lat[i] = time.perf_counter() - t
        if first[k] is None:
            first[k] = {name: a.tobytes() for name, a in out.items()}
            first_arrays[k] = {name: a.copy() for name, a in out.items()}
        elif any(a.tobytes() != first[k][name] for name, a in out.items()):  # type: ignore[index]
            drifted += 1
            ref = first_arrays[k]
            assert ref is not None
            for name, a in out.items():
                if a.dtype.kind == "f":
                    max_abs = max(max_abs, float(np.nanmax(np.abs(a.astype(np.float64) - ref[name]))))
        if (i + 1) % every == 0:
            samples.append((i + 1, rss_mb(runner.pid)))
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
        "runner_restarts": runner.restarts - restarts_before,
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
    """Where Lite ran the graph, as the table's header says it."""
    if not result["lite_in_process"]:
        return "in the runner process"
    return "in this process, on the calling thread" if result.get("lite_inline") else "in this process"


def render(result: dict[str, Any]) -> str:
    lines = [
        f"{result['env_id']} {result['graph']} ({result['format']}: {result['format_reason']}) on Lite "
        f"{result['lite_version']} {where(result)}, {result['threads']} thread(s), {result['warmup']} warm-up + "
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


def run(args: argparse.Namespace) -> dict[str, Any]:
    from inference.doctor import environment

    for name, value, low in (("--loops", args.loops, 1), ("--warmup", args.warmup, 0), ("--soak", args.soak, 0),
                             ("--episodes", args.episodes, 0), ("--threads", args.threads, 1),
                             ("--soak-inputs", args.soak_inputs, 1)):  # fmt: skip
        if value < low:
            raise BundleError(f"{name} must be >= {low}, got {value}")
    batches = parse_batches(args.batch)
    if not Path(args.bundle).exists():
        raise BundleError(f"bundle {args.bundle} does not exist")
    bundle = load_bundle(args.bundle)
    graph = args.graph or mode_graph(bundle, stochastic=False)
    bundle.graph(graph)  # an unknown graph name is a one-line BundleError
    info = runner_info()
    kwargs = {"device": args.device, "device_id": args.device_id, "threads": args.threads}
    baseline = open_baseline(bundle, graph, args.threads) if args.baseline else None  # a bad one: before Lite loads
    runner, fmt, why = open_runner(bundle, graph, args.format, **kwargs)
    env = environment(info)
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "schema_version": 1,
        "bundle": str(bundle.root),
        "env_id": bundle.manifest.get("env_id"),
        "graph": graph,
        "format": fmt,
        "format_reason": why,
        "lite_version": runner.lite_version,
        "lite_sdk": info.record if info else None,
        "runner": str(runner.runner),
        "lite_in_process": runner.pid == os.getpid(),
        "device": args.device,
        "threads": args.threads,
        "warmup": args.warmup,
        "loops": args.loops,
        "environment": {k: env[k] for k in ("python", "numpy", "machine", "cpu_model", "simd")},
    }
    with runner:
        models = [runner] if baseline is None else [runner, baseline]
        timed = bench_batches(bundle, graph, models, batches, args.warmup, args.loops, args.seed)
        result["batches"] = timed[0]
        result["lite_inline"] = bool(getattr(runner, "runs_inline", False))  # the graph ran on this thread
        if baseline is not None:
            result["baseline"] = {"runtime": "onnxruntime", "version": baseline.version,
                                  "file": str(baseline.path), "batches": timed[1]}  # fmt: skip
            baseline.close()
        if args.soak:
            result["soak"] = soak(bundle, graph, runner, args.soak, args.soak_inputs, args.seed)
    if args.episodes:
        play_graph = mode_graph(bundle, args.stochastic)
        play_runner, _, _ = open_runner(bundle, play_graph, args.format, **kwargs)
        with play_runner:
            returns = run_episodes(play_runner, bundle, play_graph, args.episodes, args.seed, args.stochastic,
                                   own_env=args.env)  # fmt: skip
        result["episodes"] = {
            "episodes": args.episodes,
            "seed": args.seed,
            "mode": "stochastic" if args.stochastic else "deterministic",
            "returns": returns,
            "mean_return": float(np.mean(returns)),
            "std_return": float(np.std(returns)),
        }
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inference.bench", description=__doc__.splitlines()[0])
    p.add_argument("bundle", help="exported bundle directory")
    p.add_argument("--graph", help="graph to time (default: the bundle's deterministic graph)")
    p.add_argument("--format", default="auto", choices=FORMATS, help="graph file to load in Lite")
    p.add_argument("--batch", default=DEFAULT_BATCHES, help=f"batch sizes (default {DEFAULT_BATCHES})")
    p.add_argument("--warmup", type=int, default=50, help="untimed requests per batch size")
    p.add_argument("--loops", type=int, default=1000, help="timed requests per batch size")
    p.add_argument("--threads", type=int, default=1, help="Lite CPU threads")
    p.add_argument("--device", default="cpu", choices=["cpu", "ascend"])
    p.add_argument("--device-id", type=int, default=0)
    p.add_argument("--isolate", action="store_true",
                   help="run Lite in the runner process (a watchdog for untrusted models) instead of this one")
    p.add_argument("--baseline", choices=["onnxruntime"],
                   help="also time the bundle's ONNX graph in ONNX Runtime, batch by batch alternately with Lite")
    p.add_argument("--soak", type=int, default=0, metavar="N", help="N single-observation soak requests")
    p.add_argument("--soak-inputs", type=int, default=64, help="distinct inputs the soak cycles over")
    p.add_argument("--episodes", type=int, default=10, help="seeded episodes for the task figure (0: skip)")
    p.add_argument("--stochastic", action="store_true", help="episodes with seeded host noise")
    p.add_argument("--env", metavar="MODULE:FACTORY", help="your own env constructor for the episodes (gymnasium API), "
                   "instead of the bundle's env id")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="bench.json", help="where to write the JSON result (default bench.json)")
    args = p.parse_args(argv)
    if args.isolate:
        os.environ["MSRL_LITE_ISOLATE"] = "1"
    try:
        result = run(args)
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    except (BundleError, ContractError, FeedError, LiteRunnerError, UsageError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:
        print(f"error: cannot write {args.json}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(render(result))
    print(f"\nwritten: {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
