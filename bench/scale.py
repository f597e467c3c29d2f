"""Where a data-parallel PPO iteration's time goes, 1 vs 2 workers: collect, gradient AllReduce, update, bytes sent.

Layouts (CartPole preset: 32 steps per env, 4 minibatches x 10 epochs = 40 updates per iteration):

* ``1x8``  one process, 8 envs: the single-process run;
* ``2x4``  2 ranks x 4 envs: the same global batch (what ``scale_learning.py`` compares for learning);
* ``2x4 rank-adv``  the same with per-rank advantage normalisation (no advantage AllReduce);
* ``2x8``  2 ranks x 8 envs: the same work per rank (what adding a machine with its own envs does).

Every rank runs the Trainer's own pieces (``collect``, ``update``, ``merge_ranks``) for ``--iterations``
iterations, under msrun for 2 ranks, timing each. Then it times the same train-step call without any collective
(a local learner) and one AllReduce alone with the ranks in lockstep (gradient-sized and advantage-sized): the
update splits into compute, AllReduces at that latency, and the rest, which is waiting for the other rank. This
machine has 2 cores shared with other tenants: two ranks plus MindSpore's runtime threads contend for them, so
the 2-worker rows show synchronisation overhead, not a speed-up. The projection for N workers on N cores uses
the 1-worker loop's components and the lockstep latencies (printed with its formula).

    .venv/bin/python bench/scale.py --iterations 30
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# name: (workers, envs per rank, advantage normalisation scope)
LAYOUTS = {"1x8": (1, 8, "global"), "2x4": (2, 4, "global"), "2x4 rank-adv": (2, 4, "rank"), "2x8": (2, 8, "global")}


# -- worker (one rank, or the single process) ------------------------------------------------------------------
def timed(fn: Callable[..., Any], bucket: list[float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            bucket.append(time.perf_counter() - start)

    return wrapper


def per_call(fns: dict[str, Callable[[], Any]], calls: int, rounds: int = 5) -> dict[str, float]:
    """Best over interleaved rounds of the mean seconds per call (after warm-up): a load spike from another
    tenant inflates a round, never deflates one. Every rank runs the same sequence, so collectives pair up."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - start) / calls)
    return {name: min(v) for name, v in samples.items()}


class AllReduceOnly:
    """A graph that only AllReduces a float32 tensor: the collective's latency with the ranks in lockstep."""

    def __new__(cls, shape: tuple[int, ...]) -> Any:
        from mindspore import Tensor, nn, ops

        class Cell(nn.Cell):
            def __init__(self) -> None:
                super().__init__()
                self.op = ops.AllReduce()

            def construct(self, x: Tensor) -> Tensor:
                return self.op(x)

        cell, x = Cell(), Tensor(np.zeros(shape, np.float32))
        return lambda: cell(x).asnumpy()


def run_worker(env_id: str, num_envs: int, adv_scope: str, iterations: int, out: Path) -> None:
    from mindspore import Tensor

    from msrl_consistency import compat
    from msrl_consistency.artifacts import run_dir as rd
    from msrl_consistency.config import parse_config
    from msrl_consistency.training import distributed as dist
    from msrl_consistency.training.learner import UPDATE_KEYS
    from msrl_consistency.training.loop import Trainer, build_learner

    cfg = parse_config(["--env-id", env_id, "--num-envs", str(num_envs), "--adv-norm-scope", adv_scope])
    if compat.cluster_role() == compat.SCHEDULER_ROLE:  # msrun runs this script as its scheduler too
        dist.run_scheduler()
        return
    if compat.cluster_role() == compat.WORKER_ROLE:
        comm: Any = dist.join_cluster(cfg.device)
    else:
        comm = dist.SingleProcess()
        compat.set_device(cfg.device)
    cfg.workers = comm.world_size
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        if comm.rank == 0:
            rd.prepare_new_run_dir(run_dir)
        trainer = Trainer(cfg, run_dir, comm=comm)
        act_t: list[float] = []
        env_t: list[float] = []
        trainer._act = timed(trainer._act, act_t)
        trainer.envs.step = timed(trainer.envs.step, env_t)
        rows = []
        payload = 0
        for _ in range(iterations):
            act_t.clear()
            env_t.clear()
            t0 = time.perf_counter()
            buf = trainer.collect()
            t1 = time.perf_counter()
            stats = trainer.update(buf)
            t2 = time.perf_counter()
            report = {"moments": None, "finished": buf["finished"], "stats": stats,
                      "values": buf["values"].ravel(), "returns": buf["returns"].ravel()}  # fmt: skip
            payload = len(pickle.dumps(report, protocol=pickle.HIGHEST_PROTOCOL))
            merged = trainer.merge_ranks(buf, stats)
            trainer.rms.update_from_moments(*merged["moments"])
            trainer.rms.copy_to(trainer.policy.normalizer)
            t3 = time.perf_counter()
            rows.append({"collect": t1 - t0, "act": sum(act_t), "env": sum(env_t), "update": t2 - t1,
                         "exchange": t3 - t2, "iteration": t3 - t0})  # fmt: skip

        # The same train-step call without any collective (a local learner), and AllReduce alone, ranks in lockstep.
        flat = [Tensor(buf[k].reshape(cfg.batch_size, *buf[k].shape[2:])) for k in UPDATE_KEYS]
        k = trainer.train_step.updates_per_call
        idx = Tensor(np.stack([np.arange(cfg.minibatch_size) for _ in range(k)]).astype(np.int32))
        local = compat.CompiledCall(build_learner(cfg, trainer.spec, world_size=1).train_step)
        calls = per_call({"local": lambda: local(*flat, idx).asnumpy()}, calls=10)
        grad_bytes = sum(int(np.prod(p.shape)) * 4 for p in trainer.policy.trainable_params())
        lockstep = {}
        if comm.world_size > 1:
            lockstep = per_call({"gradient": AllReduceOnly((grad_bytes // 4,)), "advantage": AllReduceOnly((k, 1))},
                                calls=50)  # fmt: skip
        result = {
            "rank": comm.rank,
            "world_size": comm.world_size,
            "num_envs": num_envs,
            "updates_per_iteration": cfg.num_minibatches * cfg.update_epochs,
            "updates_per_call": k,
            "num_steps": cfg.num_steps,
            "act_calls_per_iteration": cfg.num_steps + 1,
            "iterations": rows[1:],  # the first pays the compiles
            "per_update": {n: t / k for n, t in calls.items()},
            "lockstep_allreduce": lockstep,
            "adv_scope": adv_scope,
            "gradient_bytes": grad_bytes,
            "exchange_payload_bytes": payload,
        }
        trainer.close()
    (out / f"rank_{comm.rank}.json").write_text(json.dumps(result))


# -- driver ----------------------------------------------------------------------------------------------------
def measure(layout: str, env_id: str, iterations: int, out: Path) -> list[dict[str, Any]]:
    workers, envs, adv_scope = LAYOUTS[layout]
    out = out / layout.replace(" ", "-")
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("rank_*.json"):
        old.unlink()
    worker = [str(Path(__file__).resolve()), "--rank-worker", "--env", env_id, "--num-envs", str(envs),
              "--adv-scope", adv_scope, "--iterations", str(iterations), "--out", str(out)]  # fmt: skip
    if workers == 1:
        subprocess.run([sys.executable, *worker], cwd=REPO, check=True)
    else:
        from msrl_consistency.training.distributed import launch

        port = launch.free_port("127.0.0.1")
        cmd = [sys.executable, "-m", "mindspore.parallel.cluster.run", f"--worker_num={workers}",
               f"--local_worker_num={workers}", "--master_addr=127.0.0.1", f"--master_port={port}",
               f"--log_dir={out / 'logs'}", "--join=True", "--cluster_time_out=120", *worker]  # fmt: skip
        env = {k: v for k, v in launch.worker_env(out).items() if k != "MSRL_RANK_STATUS_DIR"}
        subprocess.run(cmd, cwd=REPO, check=True, env=env, stdout=subprocess.DEVNULL)
    return [json.loads((out / f"rank_{r}.json").read_text()) for r in range(workers)]


def median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def report(results: dict[str, list[dict[str, Any]]]) -> str:
    lines = [
        "Per iteration, milliseconds (medians over the real loop's iterations, rank 0; the slowest rank's iteration "
        "in brackets). The update is split into its compute (the same train-step call without collectives, timed "
        "alone, best of 5 rounds), the gradient and advantage AllReduces at their lockstep latency (one AllReduce "
        "timed alone, times how many an iteration makes), and what remains: waiting for the other rank, i.e. "
        "contention.",
        "",
        "| layout | iteration | collect (act + env + rest) | update | compute | gradient AllReduce "
        "| advantage AllReduce | waiting | exchange (host AllGather) | env steps/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    split: dict[str, dict[str, float]] = {}
    for layout, ranks in results.items():
        r0 = ranks[0]
        rows, n_upd = r0["iterations"], r0["updates_per_iteration"]
        calls = n_upd // r0["updates_per_call"]
        it, update = median(rows, "iteration"), median(rows, "update")
        slowest = max(median(r["iterations"], "iteration") for r in ranks)
        ls = r0["lockstep_allreduce"]
        compute = n_upd * r0["per_update"]["local"] if ls else update
        grad = n_upd * ls["gradient"] if ls else 0.0
        adv = 2 * calls * ls["advantage"] if ls and r0["adv_scope"] == "global" else 0.0
        act, env, collect = median(rows, "act"), median(rows, "env"), median(rows, "collect")
        steps = r0["world_size"] * r0["num_envs"] * r0["num_steps"]
        split[layout] = {"act": act, "env": env, "rest": collect - act - env, "update": update, "grad": grad,
                         "adv": adv, "exchange": median(rows, "exchange"), "iteration": it, "steps": steps}  # fmt: skip
        lines.append(
            f"| {layout} | {ms(it)} [{ms(slowest)}] | {ms(collect)} ({ms(act)} + {ms(env)} + {ms(collect - act - env)})"
            f" | {ms(update)} | {ms(compute)} | {ms(grad)} | {ms(adv)} | {ms(update - compute - grad - adv)}"
            f" | {ms(median(rows, 'exchange'))} | {steps / it:.0f} |"
        )
    lines += [
        "",
        "One AllReduce alone (ranks in lockstep, nothing else running in them) and the bytes each rank sends:",
        "",
        "| layout | gradient AllReduce | its bytes per update | advantage AllReduce | its bytes per train-step call "
        "| exchange bytes per iteration |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for layout, ranks in results.items():
        r0 = ranks[0]
        w, g, ls = r0["world_size"], r0["gradient_bytes"], r0["lockstep_allreduce"]
        if w == 1:
            continue
        ring = 2 * (w - 1) / w * g  # ring AllReduce: reduce-scatter + all-gather, each (w-1)/w of the payload
        adv = 2 * 2 * (w - 1) / w * r0["updates_per_call"] * 4 if r0["adv_scope"] == "global" else 0
        exchange = (w - 1) * r0["exchange_payload_bytes"]  # AllGather: each rank's payload goes to w-1 others
        lines.append(
            f"| {layout} | {ms(ls['gradient'])} ms | {ring:,.0f} B (payload {g:,} B) | {ms(ls['advantage'])} ms "
            f"| {adv:,.0f} B | {exchange:,.0f} B |"
        )
    lines += ["", projection(split)]
    return "\n".join(lines)


def projection(split: dict[str, dict[str, float]]) -> str:
    """N workers on N cores, from the 1-worker loop and the 2-worker lockstep collective latencies."""
    if "1x8" not in split or "2x4" not in split:
        return ""
    one, two = split["1x8"], split["2x4"]
    hop = two["grad"] + two["adv"] + two["exchange"]
    fixed = one["act"] + one["rest"] + one["update"]
    base = fixed + one["env"]
    out = [
        "Projection for N workers on N cores (one rank per core, no contention): strong scaling (the 1x8 global "
        "batch split over N ranks) and weak scaling (8 envs per rank):",
        "",
        "    T(N)      = act + env/N + rest + update + (N-1) x C",
        f"    T_weak(N) = act + env   + rest + update + (N-1) x C,   throughput N x {one['steps']} steps / T_weak(N)",
        f"    act {ms(one['act'])}, env {ms(one['env'])}, rest {ms(one['rest'])}, update {ms(one['update'])} ms from "
        "the 1x8 loop (act calls and updates cost the same whatever their batch: MindSpore's CPU kernels are",
        f"    launch-bound at these sizes); C = {ms(hop)} ms = the 2x4 run's gradient and advantage AllReduces at "
        "their lockstep latency plus its exchange, one ring hop, times N-1 hops for N ranks:",
        "    an upper bound: latency-bound messages take N-1 hops, while a bandwidth-bound ring sends at most twice",
        "    the payload per rank whatever N.",
        "",
        "| N | strong: iteration ms | strong speed-up | weak: env steps/s | weak speed-up |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n in (1, 2, 4, 8):
        strong = fixed + one["env"] / n + (n - 1) * hop
        weak = fixed + one["env"] + (n - 1) * hop
        out.append(
            f"| {n} | {ms(strong)} | {base / strong:.2f}x | {n * one['steps'] / weak:.0f} | {n * base / weak:.2f}x |"
        )
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--out", type=Path, default=REPO / "reports/bench/scale")
    parser.add_argument("--rank-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--num-envs", type=int, default=8, help=argparse.SUPPRESS)
    parser.add_argument("--adv-scope", default="global", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("GLOG_v", "3")
    if args.rank_worker:  # not "--worker": msrun would take it for an abbreviation of its --worker_num
        run_worker(args.env, args.num_envs, args.adv_scope, args.iterations, args.out)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    layouts = [name.strip() for name in args.layouts.split(",")]
    results = {layout: measure(layout, args.env, args.iterations, args.out) for layout in layouts}
    (args.out / "scale.json").write_text(json.dumps(results, indent=1))
    text = f"{args.env}, {args.iterations} iterations per layout; load average before: {load}\n\n{report(results)}\n"
    (args.out / "scale.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
