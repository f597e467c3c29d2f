"""Training throughput and sample efficiency: our MindSpore PPO vs a lean PyTorch PPO vs Stable-Baselines3.

Every (env, seed, framework) run is its own subprocess, run one after another: the frameworks never share
a process (thread pools, MindSpore's global context) and the machine only carries one heavy job. Ours is
the real CLI, so its total time includes MindSpore import and graph compile; its SPS is the steady state
read from metrics.csv (after the first iteration, which holds the compile). ``ours`` loads its graphs from a compile
cache warmed by two one-iteration runs before the first measured run (what every run of a config after its second
gets: the first compiles the graphs, the second also builds the fused kernels that the loaded graphs name, for a
preset with graph-kernel fusion); ``ours-cold`` compiles them into a fresh cache dir per run (a config's first run).

    .venv/bin/python bench/train_throughput.py --envs CartPole-v1 --seeds 1,2,3 --frameworks ours,ours-cold,torch,sb3

The host's speed drifts by up to 2x within minutes, so one run per framework and seed can hand a seed to whichever
framework ran in a fast phase. ``--rounds N`` runs every (seed, framework) pair N times, the frameworks rotated
round by round, and the tables compare the median of each pair's rounds (steps to target are the same in every
round: a seed's run is deterministic on one host).

Wall seconds to target only (``--stop-at-target``), and some frameworks need millions of steps (SB3's rl-zoo3
BipedalWalker settings): ``--race`` runs each seed's frameworks in the order given and stops a later one once its
training wall passes the best wall to target so far. It could not have come first; the table shows "> s (raced)".

    .venv/bin/python bench/train_throughput.py --envs BipedalWalker-v3 --seeds 1,2,3 --frameworks ours,torch,sb3 \
        --eval-every-steps 81920 --stop-at-target --race --give-up-at 1500000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from inference.machine.facts import cpu_summary  # noqa: E402
from msrl_consistency.config import load_toml, parse_config, preset_path  # noqa: E402  (no MindSpore import here)

# "Solved" levels for the training curve: the moving average of the last WINDOW episodes must stay at or above.
THRESHOLDS = {"CartPole-v1": 475.0, "Pendulum-v1": -200.0, "BipedalWalker-v3": 300.0, "Hopper-v5": 3000.0}
# The targets: CartPole's training returns stay >= 475; the others' deterministic evaluation reaches thr.
TRAINING_MEAN_TARGET = {"CartPole-v1"}
# The PyTorch twin at its own best settings ("torch-best"): the presets tuned for this algorithm before the envs per
# act call were raised for MindSpore's fixed per-call cost (a cost PyTorch does not have).
TORCH_BEST: dict[str, dict[str, Any]] = {
    "CartPole-v1": dict(num_envs=8, num_steps=32, num_minibatches=4, update_epochs=10, learning_rate=1e-3,
                        gamma=0.99, gae_lambda=0.8, ent_coef=0.0, clip_vloss=False),
    "Pendulum-v1": dict(num_envs=4, num_steps=512, num_minibatches=32, update_epochs=10, learning_rate=1e-3,
                        gamma=0.9, gae_lambda=0.95, ent_coef=0.0, reward_scale=0.1, init_log_std=-0.5),
    # Our preset with the value loss clipped: the twin's best on ten seeds (10/10 by 1.15M steps), where ours' preset
    # leaves seed 4 under 300 until 2.87M steps (bench/results/bipedalwalker_twin_10seeds.md).
    "BipedalWalker-v3": dict(num_envs=16, num_steps=256, num_minibatches=8, update_epochs=10, learning_rate=3e-4,
                             gamma=0.99, gae_lambda=0.95, ent_coef=0.0, hidden_sizes=[256, 256, 128],
                             reward_scale=0.1, init_log_std=-0.5, clip_vloss=True),
}  # fmt: skip
WINDOW = 10
# ours and ours-gym load their graphs from a compile cache warmed before the first measured run (what every run of
# a config after its first gets); ours-cold compiles them, from a fresh cache dir per run (a config's first run).
FRAMEWORKS = ("ours", "ours-mindspore", "ours-cold", "ours-gym", "ours-envpool", "torch", "torch-best", "sb3")
WARM_CACHE = ("ours", "ours-mindspore", "ours-gym", "ours-envpool")
BACKENDS = {"ours": "auto", "ours-mindspore": "auto", "ours-cold": "auto", "ours-gym": "gymnasium",
            "ours-envpool": "envpool"}  # fmt: skip
# ours acts through the run's default rollout engine (ONNX Runtime where it can); ours-mindspore through the
# learner's own compiled graph (--rollout-engine mindspore)
ROLLOUT_ENGINES = {"ours-mindspore": "mindspore"}
EVAL_EVERY_EPISODES = 5  # deterministic episodes per periodic evaluation (the final one uses --eval-episodes)
# rl-zoo3's tuned PPO settings (hyperparams/ppo.yml); Pendulum without gSDE so all three use a plain Gaussian.
SB3_ZOO: dict[str, dict[str, Any]] = {
    "CartPole-v1": dict(n_envs=8, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20,
                        ent_coef=0.0, learning_rate="lin_1e-3", clip_range="lin_0.2"),
    "Pendulum-v1": dict(n_envs=4, n_steps=1024, gae_lambda=0.95, gamma=0.9, n_epochs=10, ent_coef=0.0,
                        learning_rate=1e-3, clip_range=0.2),
    # normalize: VecNormalize (observations and rewards), as rl-zoo3's `normalize: true`.
    "BipedalWalker-v3": dict(normalize=True, n_envs=32, n_steps=2048, batch_size=64, gae_lambda=0.95, gamma=0.999,
                             n_epochs=10, ent_coef=0.0, learning_rate=3e-4, clip_range=0.18),
}  # fmt: skip


def preset(env_id: str) -> dict[str, Any]:
    path = preset_path(env_id)
    return load_toml(path) if path.exists() else {"env_id": env_id}


def steps_to_eval_threshold(evals: list[tuple[int, float]], threshold: float) -> int | None:
    """Env step of the first periodic deterministic evaluation whose mean return reaches ``threshold``."""
    return next((int(step) for step, mean in evals if mean >= threshold), None)


def target_step(result: dict[str, Any]) -> int | None:
    """The env step at which a run met its env's target (CartPole: the training mean; others: an evaluation)."""
    key = "steps_to_threshold" if result["env_id"] in TRAINING_MEAN_TARGET else "steps_to_eval_threshold"
    return result[key]


def iterations_between(eval_every_steps: int, batch: int) -> int:
    """``--eval-every-steps`` in a framework's own iterations (0: off)."""
    return 0 if eval_every_steps <= 0 else max(1, round(eval_every_steps / batch))


def steps_to_threshold(episodes: list[tuple[int, float]], threshold: float, window: int = WINDOW) -> int | None:
    """Env step of the first episode from which the moving average never drops below ``threshold`` again."""
    if not episodes:
        return None
    returns = np.array([r for _, r in episodes])
    moving = np.array([returns[max(0, i - window + 1) : i + 1].mean() for i in range(len(returns))])
    below = np.flatnonzero(moving < threshold)
    if len(below) == 0:
        return int(episodes[0][0])
    if below[-1] == len(returns) - 1:
        return None
    return int(episodes[below[-1] + 1][0])


# -- workers (run in their own process) ----------------------------------------------------------------
def sb3_hparams(env_id: str) -> dict[str, Any]:
    """rl-zoo3 settings where known, else our preset translated to SB3 names."""
    if env_id in SB3_ZOO:
        return dict(SB3_ZOO[env_id])
    p = preset(env_id)
    n_envs, n_steps = p.get("num_envs", 8), p.get("num_steps", 128)
    return dict(
        n_envs=n_envs,
        n_steps=n_steps,
        batch_size=n_envs * n_steps // p.get("num_minibatches", 4),
        n_epochs=p.get("update_epochs", 4),
        gamma=p.get("gamma", 0.99),
        gae_lambda=p.get("gae_lambda", 0.95),
        ent_coef=p.get("ent_coef", 0.01),
        learning_rate=f"lin_{p.get('learning_rate', 2.5e-4)}",
    )


def run_sb3(env_id: str, steps: int, seed: int, eval_episodes: int, eval_every_steps: int,
            stop_at: float | None = None, give_up_at: int | None = None,
            give_up_after_s: float | None = None) -> dict[str, Any]:  # fmt: skip
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)
    hp = sb3_hparams(env_id)
    for key in ("learning_rate", "clip_range"):
        if isinstance(hp.get(key), str):
            initial = float(hp[key][4:])
            hp[key] = lambda progress, v=initial: progress * v  # progress_remaining goes 1 → 0
    n_envs, normalize = hp.pop("n_envs"), hp.pop("normalize", False)
    import torch_ppo  # the benchmark's shared evaluation loop (same seeds for every framework)

    def deterministic_returns(episodes: int) -> list[float]:
        # VecNormalize's statistics as they stand (normalize_obs does not update them).
        prepare = envs.normalize_obs if normalize else (lambda obs: obs)
        return torch_ppo.evaluate(lambda obs: model.predict(prepare(obs), deterministic=True)[0], env_id, seed,
                                  episodes)  # fmt: skip

    class Recorder(BaseCallback):
        """Episode returns from the Monitor wrapper, periodic evaluations (their time excluded), and when the
        first rollout ended (for steady SPS)."""

        def __init__(self, eval_every: int) -> None:
            super().__init__()
            self.episodes: list[tuple[int, float]] = []
            self.first_rollout: tuple[int, float] | None = None
            self.eval_every, self.rollouts = eval_every, 0
            self.evals: list[tuple[int, float]] = []
            self.progress: list[tuple[int, float]] = []
            self.eval_wall = self.eval_cpu = 0.0
            self.reached = False

        def _on_rollout_end(self) -> None:
            self.rollouts += 1
            self.progress.append((self.num_timesteps, time.perf_counter() - start - self.eval_wall))
            if self.eval_every and self.rollouts % self.eval_every == 0:
                t0, c0 = time.perf_counter(), time.process_time()
                self.evals.append((self.num_timesteps, float(np.mean(deterministic_returns(EVAL_EVERY_EPISODES)))))
                self.reached = stop_at is not None and self.evals[-1][1] >= stop_at
                self.eval_wall += time.perf_counter() - t0
                self.eval_cpu += time.process_time() - c0

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.episodes.append((self.num_timesteps, float(info["episode"]["r"])))
            given_up = give_up_at is not None and self.num_timesteps >= give_up_at
            if give_up_after_s is not None:  # a race: another framework reached the target in this many seconds
                given_up |= time.perf_counter() - start - self.eval_wall >= give_up_after_s
            return not (self.reached or given_up)  # False ends learn() (--stop-at-target, --give-up-at, --race)

        def _on_rollout_start(self) -> None:
            if self.first_rollout is None and self.num_timesteps > 0:
                self.first_rollout = (self.num_timesteps, time.perf_counter())

    envs = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    if normalize:
        from stable_baselines3.common.vec_env import VecNormalize

        envs = VecNormalize(envs, gamma=hp["gamma"])
    model = PPO("MlpPolicy", envs, seed=seed, device="cpu", verbose=0, **hp)
    rec = Recorder(iterations_between(eval_every_steps, n_envs * hp["n_steps"]))
    start, cpu_start = time.perf_counter(), time.process_time()
    model.learn(total_timesteps=steps, callback=rec)
    end, cpu = time.perf_counter() - rec.eval_wall, time.process_time() - cpu_start - rec.eval_cpu
    done_steps = int(model.num_timesteps)
    steady = done_steps / (end - start)
    if rec.first_rollout is not None and rec.first_rollout[0] < done_steps:
        steady = (done_steps - rec.first_rollout[0]) / (end - rec.first_rollout[1])
    returns = deterministic_returns(eval_episodes)
    return {
        "wall_time": end - start,
        "cpu_time": cpu,
        "sps": done_steps / (end - start),
        "sps_steady": steady,
        "global_step": done_steps,
        "episodes": rec.episodes,
        "evals": rec.evals,
        "progress": rec.progress,
        "eval_returns": returns,
        "hparams": sb3_hparams(env_id),
    }


def worker(framework: str, env_id: str, steps: int, seed: int, eval_episodes: int, eval_every_steps: int,
           out: Path, stop_at_target: bool = False, give_up_at: int | None = None,
           give_up_after_s: float | None = None) -> None:  # fmt: skip
    from msrl_consistency.training.profile import peak_rss_mb  # no MindSpore import: torch and SB3 workers use it too

    # --stop-at-target: end a run at its first evaluation reaching the target (the evaluation-target envs only).
    stop_at = THRESHOLDS.get(env_id) if stop_at_target and env_id not in TRAINING_MEAN_TARGET else None
    if framework.startswith("ours"):
        if give_up_after_s is not None:
            raise SystemExit("--race: ours has no wall budget; list it first in --frameworks")
        result = run_ours(env_id, steps, seed, eval_episodes, eval_every_steps, out.parent, BACKENDS[framework],
                          stop_at, give_up_at, ROLLOUT_ENGINES.get(framework, "auto"))  # fmt: skip
    elif framework.startswith("torch"):
        import torch_ppo

        settings = TORCH_BEST.get(env_id, preset(env_id)) if framework == "torch-best" else preset(env_id)
        hp = {k: v for k, v in settings.items() if k not in torch_ppo.IGNORED_KEYS}
        hparams = torch_ppo.HParams.from_dict(hp)
        batch = hparams.num_envs * hparams.num_steps
        result = torch_ppo.train(env_id, steps, seed, eval_episodes=eval_episodes,
                                 eval_every=iterations_between(eval_every_steps, batch),
                                 eval_every_episodes=EVAL_EVERY_EPISODES, stop_at_eval=stop_at, give_up_at=give_up_at,
                                 give_up_after_s=give_up_after_s, **hp)  # fmt: skip
        result["hparams"] = hp
    else:
        result = run_sb3(env_id, steps, seed, eval_episodes, eval_every_steps, stop_at, give_up_at, give_up_after_s)
    # Reached, not merely ended early: a run given up on (--give-up-at) also ends before ``steps``.
    result["stopped_at_target"] = stop_at is not None and steps_to_eval_threshold(result["evals"], stop_at) is not None
    result["peak_rss_mb"] = peak_rss_mb()
    out.write_text(json.dumps(result))


def run_ours(env_id: str, steps: int, seed: int, eval_episodes: int, eval_every_steps: int,
             run_dir: Path, backend: str = "auto", stop_at: float | None = None,
             give_up_at: int | None = None, rollout_engine: str = "auto") -> dict[str, Any]:  # fmt: skip
    """What ``python -m msrl_consistency.train`` does, through the Trainer API so the loop's CPU time is visible."""
    t_import = time.perf_counter()
    from msrl_consistency.artifacts import run_dir as rd
    from msrl_consistency.training.loop import Trainer

    import_time = time.perf_counter() - t_import
    argv = ["--env-id", env_id, "--run-dir", str(run_dir), "--total-steps", str(steps), "--seed", str(seed),
            "--progress", "false", "--eval-episodes", str(EVAL_EVERY_EPISODES), "--env-backend", backend,
            "--rollout-engine", rollout_engine]  # fmt: skip
    cfg = parse_config(argv)
    cfg.eval_every = iterations_between(eval_every_steps, cfg.batch_size)
    cfg.stop_at_return = "" if stop_at is None else repr(stop_at)
    cfg.validate()  # --stop-at-return needs the evaluations just set
    rd.prepare_new_run_dir(run_dir)
    trainer = Trainer(cfg, run_dir)
    trainer.use_compile_cache()  # under $MSRL_COMPILE_CACHE_DIR, set by run_one
    try:
        trainer.checkpoint()
        start, cpu_start = time.perf_counter(), time.process_time()
        trainer.run(stop_at=None if give_up_at is None else -(-give_up_at // cfg.global_batch_size))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
        eval_returns = trainer.evaluate(eval_episodes)
        trainer.checkpoint(eval_returns)
    finally:
        trainer.close()
    rows = [(int(r["global_step"]), float(r["wall_time"])) for r in rd.read_log(run_dir / rd.METRICS_CSV)]
    profile = trainer.profile_report()
    episodes, evals = rd.episode_returns(run_dir), rd.eval_means(run_dir)
    eval_rows = rd.read_log(run_dir / rd.EVALS_CSV)  # none without periodic evaluations
    # Excluded like metrics.csv's wall_time, and their CPU seconds from the CPU time (as for torch and sb3).
    wall -= sum(float(r["seconds"]) for r in eval_rows)
    cpu -= sum(float(r["cpu_seconds"]) for r in eval_rows)
    # Steady state: everything after the first iteration, which also pays the act and train-step compiles.
    (step0, t0), (step1, t1) = rows[0], rows[-1]
    steady = (step1 - step0) / (t1 - t0) if len(rows) > 1 else step1 / t1
    return {"wall_time": wall, "cpu_time": cpu, "sps": step1 / wall, "sps_steady": steady, "global_step": step1,
            "episodes": episodes, "evals": evals, "eval_returns": eval_returns, "import_time": import_time,
            "compile_time": profile["sections"]["compile"]["seconds"], "hparams": cfg.to_dict(), "progress": rows,
            "env_backend": trainer.backend.name, "profile": profile,
            "compile_cache": trainer.compile_cache["state"]}  # fmt: skip


# -- driver ---------------------------------------------------------------------------------------------
def run_one(framework: str, env_id: str, steps: int, seed: int, eval_episodes: int, eval_every_steps: int,
            out_dir: Path, round_: int = 1, stop_at_target: bool = False,
            give_up_at: int = 0, give_up_after_s: float | None = None) -> dict[str, Any]:  # fmt: skip
    suffix = "" if round_ == 1 else f"-r{round_}"
    run_dir = out_dir / "runs" / f"{framework}-{env_id}-s{seed}{suffix}"
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    cmd = [sys.executable, __file__, "--worker", framework, "--envs", env_id, "--steps", str(steps), "--seeds",
           str(seed), "--eval-episodes", str(eval_episodes), "--eval-every-steps", str(eval_every_steps),
           "--out", str(run_dir / "result.json")] + ["--stop-at-target"] * stop_at_target  # fmt: skip
    cmd += ["--give-up-at", str(give_up_at)] * bool(give_up_at)
    cmd += [] if give_up_after_s is None else ["--give-up-after-s", repr(give_up_after_s)]
    env = dict(os.environ)
    if framework.startswith("ours"):
        cache = out_dir / "graph-cache" if framework in WARM_CACHE else run_dir / "graph-cache"
        env["MSRL_COMPILE_CACHE_DIR"] = str(cache)
    start = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, check=True, env=env)
    result = json.loads((run_dir / "result.json").read_text())
    result["total_time"] = time.perf_counter() - start  # process wall: interpreter, imports, compile, eval
    result.update(framework=framework, env_id=env_id, seed=seed, round=round_, host=cpu_summary())
    threshold = THRESHOLDS.get(env_id, float("inf"))
    result["steps_to_threshold"] = steps_to_threshold(result["episodes"], threshold)
    result["steps_to_eval_threshold"] = steps_to_eval_threshold(result.get("evals", []), threshold)
    result["eval_mean"] = float(np.mean(result["eval_returns"])) if result["eval_returns"] else None
    result["wall_to_target"] = wall_at_step(result.get("progress", []), target_step(result))
    result["gave_up_after_s"] = give_up_after_s
    return result


def wall_at_step(progress: list[tuple[int, float]], step: int | None) -> float | None:
    """Training wall seconds (evaluations excluded) when the iteration holding env step ``step`` ended."""
    if step is None:
        return None
    return next((float(wall) for s, wall in progress if s >= step), None)


def raced_out(r: dict[str, Any]) -> float | None:
    """How long a run stopped by ``--race`` trained without reaching the target (``None``: not raced out)."""
    return r["wall_time"] if r.get("wall_to_target") is None and r.get("gave_up_after_s") is not None else None


def race_cell(r: dict[str, Any]) -> str:
    """Wall to target, or how long a raced run (``--race``) trained without reaching it."""
    out = raced_out(r)
    return fmt(r.get("wall_to_target"), 1) if out is None else f"– (raced: none in {out:.1f})"


def fmt(value: float | None, digits: int = 0) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def median_or_none(values: list[float | None]) -> float | None:
    """Median over a pair's rounds, a run that never got there counting as infinitely late; None if the median is."""
    if not values:
        return None
    m = float(np.median([np.inf if v is None else v for v in values]))
    return None if np.isinf(m) else m


def by_seed(rs: list[dict[str, Any]], key: str) -> dict[int, list[Any]]:
    """``key`` of each run, grouped by seed (a seed's rounds), seeds in first-run order."""
    out: dict[int, list[Any]] = {}
    for r in rs:
        out.setdefault(r["seed"], []).append(r.get(key))
    return out


def leaders(results: list[dict[str, Any]]) -> list[str]:
    """Per env and seed: each framework's median wall seconds to target (range over rounds) and which was first."""
    frameworks = list(dict.fromkeys(r["framework"] for r in results))
    head = "| env | seed | " + " | ".join(frameworks) + " | first |"
    lines = [head, "|---|---:|" + "---:|" * len(frameworks) + "---|"]
    pairs: dict[tuple[str, int], dict[str, list[dict[str, Any]]]] = {}
    for r in results:
        pairs.setdefault((r["env_id"], r["seed"]), {}).setdefault(r["framework"], []).append(r)
    for (env, seed), by_fw in pairs.items():
        medians = {fw: median_or_none([r.get("wall_to_target") for r in rs]) for fw, rs in by_fw.items()}
        cells = []
        for fw in frameworks:
            runs = [r.get("wall_to_target") for r in by_fw.get(fw, [])]
            cell = fmt(medians.get(fw), 1) if runs else ""
            raced = [w for w in map(raced_out, by_fw.get(fw, [])) if w is not None]
            if medians.get(fw) is None and raced:  # stopped by --race: not there by the leader's time
                cell = f"> {min(raced):.1f} (raced)"
            reached = [w for w in runs if w is not None]
            if len(runs) > 1 and reached:
                cell += f" ({min(reached):.1f}-{max(reached):.1f}, {len(reached)}/{len(runs)})"
            cells.append(cell)
        timed = {fw: m for fw, m in medians.items() if m is not None}
        first = min(timed, key=timed.get) if timed else "none"
        lines.append(f"| {env} | {seed} | " + " | ".join(cells) + f" | {first} |")
    return lines


def tables(results: list[dict[str, Any]]) -> str:
    """Per-run table, one summary row per (env, framework), then who reached the target first on each seed; ratios
    are against the lean PyTorch PPO. With several rounds a seed's figures are the median over its rounds.

    The machine is shared, so wall-clock SPS moves with other people's load; the CPU-time ratio (CPU seconds
    the training loop itself used) is the steadier comparison and is shown next to it.
    """

    def cpu_sps(r: dict[str, Any]) -> float:
        return r["global_step"] / r["cpu_time"]

    ref = {(r["env_id"], r["seed"], r.get("round", 1)): r for r in results if r["framework"] == "torch"}
    lines = [
        "| framework | env | seed | round | train s/100k | CPU s/100k | total s | compile s | steady SPS "
        "| SPS vs torch | CPU-SPS vs torch | steps to ≥thr | steps to eval ≥thr | wall s to target | eval mean "
        "| peak RSS MB |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        t = ref.get((r["env_id"], r["seed"], r.get("round", 1)))
        ratio = f"{r['sps_steady'] / t['sps_steady']:.2f}x" if t else "–"
        cpu_ratio = f"{cpu_sps(r) / cpu_sps(t):.2f}x" if t else "–"
        per_100k, cpu_100k = (r[k] / r["global_step"] * 100_000 for k in ("wall_time", "cpu_time"))
        cells = [
            r["framework"],
            r["env_id"],
            r["seed"],
            r.get("round", 1),
            f"{per_100k:.1f}",
            f"{cpu_100k:.1f}",
            f"{r['total_time']:.1f}",
            fmt(r.get("compile_time"), 1) + (f" ({r['compile_cache']})" if "compile_cache" in r else ""),
            f"{r['sps_steady']:,.0f}",
            ratio,
            cpu_ratio,
            fmt(r["steps_to_threshold"]),
            fmt(r.get("steps_to_eval_threshold")),
            race_cell(r),
            fmt(r["eval_mean"], 1),
            fmt(r.get("peak_rss_mb")),
        ]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines += [
        "",
        "| framework | env | seeds | runs | mean steady SPS | SPS vs torch | CPU-SPS vs torch | reached thr "
        "| median steps to thr | median steps to eval thr | wall s to target (per seed) | eval means | peak RSS MB |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|",
    ]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["env_id"], r["framework"]), []).append(r)
    for (env, fw), rs in groups.items():
        sps, csps = float(np.mean([r["sps_steady"] for r in rs])), float(np.mean([cpu_sps(r) for r in rs]))
        ts = groups.get((env, "torch"))
        ratio = f"{sps / np.mean([r['sps_steady'] for r in ts]):.2f}x" if ts else "–"
        cpu_ratio = f"{csps / np.mean([cpu_sps(r) for r in ts]):.2f}x" if ts else "–"
        steps = {seed: median_or_none(v) for seed, v in by_seed(rs, "steps_to_threshold").items()}
        reached = [v for v in steps.values() if v is not None]
        median = float(np.median(reached)) if reached else None
        eval_steps = map(median_or_none, by_seed(rs, "steps_to_eval_threshold").values())
        eval_reached = [v for v in eval_steps if v is not None]
        eval_median = float(np.median(eval_reached)) if eval_reached else None
        evals = ", ".join(fmt(median_or_none(v), 1) for v in by_seed(rs, "eval_mean").values())
        walls = ", ".join(fmt(median_or_none(v), 1) for v in by_seed(rs, "wall_to_target").values())
        rss = max((r.get("peak_rss_mb") or 0) for r in rs)
        lines.append(
            f"| {fw} | {env} | {len(steps)} | {len(rs)} | {sps:,.0f} | {ratio} | {cpu_ratio} "
            f"| {len(reached)}/{len(steps)} | {fmt(median)} | {fmt(eval_median)} | {walls} | {evals} | {rss:,.0f} |"
        )
    lines += ["", "Wall seconds to target (median over rounds; range and how many rounds got there):", ""]
    return "\n".join(lines + leaders(results))


def plot(results: list[dict[str, Any]], path: Path) -> None:
    """Moving-average training return vs env steps, one panel per env, one colour per framework."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(dict.fromkeys(r["env_id"] for r in results))
    colours = {
        "ours": "tab:red",
        "ours-cold": "tab:pink",
        "ours-mindspore": "tab:olive",
        "ours-gym": "tab:orange",
        "torch": "tab:blue",
        "torch-best": "tab:cyan",
        "sb3": "tab:green",
    }
    fig, axes = plt.subplots(1, len(envs), figsize=(6.5 * len(envs), 4.2), squeeze=False)
    for ax, env in zip(axes[0], envs, strict=True):
        seen: set[str] = set()
        for r in (r for r in results if r["env_id"] == env and r["episodes"]):
            steps, returns = np.array(r["episodes"]).T
            moving = np.array([returns[max(0, i - WINDOW + 1) : i + 1].mean() for i in range(len(returns))])
            label = None if r["framework"] in seen else r["framework"]
            seen.add(r["framework"])
            ax.plot(steps, moving, color=colours.get(r["framework"], "grey"), alpha=0.8, lw=1.2, label=label)
        if env in THRESHOLDS:
            ax.axhline(THRESHOLDS[env], color="black", ls="--", lw=0.8)
        ax.set(title=f"PPO on {env} (moving mean of {WINDOW} episodes)", xlabel="env steps", ylabel="return")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default="CartPole-v1", help="comma-separated Gymnasium ids")
    parser.add_argument("--steps", type=int, default=0, help="env steps per run (default: the env preset's)")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--frameworks", default="ours,torch,sb3")
    parser.add_argument("--rounds", type=int, default=1, help="runs per (seed, framework), frameworks rotated")
    parser.add_argument("--eval-episodes", type=int, default=10, help="deterministic episodes of the final eval")
    periodic = f"also evaluate ({EVAL_EVERY_EPISODES} episodes) about every N env steps; 0: off"
    parser.add_argument("--eval-every-steps", type=int, default=2048, help=periodic)
    parser.add_argument("--out", default="reports/bench/train_throughput", help="output dir (json, md, png, runs)")
    parser.add_argument("--merge", nargs="+", metavar="JSON", help="only tabulate and plot earlier runs' json files")
    parser.add_argument(
        "--stop-at-target",
        action="store_true",
        help="end each run at its first periodic evaluation reaching the env's target (Pendulum, "
        "BipedalWalker, Hopper; the learning rate still anneals over --steps): wall to target only",
    )
    parser.add_argument(
        "--give-up-at",
        type=int,
        default=0,
        metavar="STEPS",
        help="end each run after STEPS env steps (a screen; the learning rate anneals over --steps)",
    )
    parser.add_argument(
        "--race",
        action="store_true",
        help="with --stop-at-target: per seed and round, run the frameworks in the given order (not "
        "rotated) and stop each later run once its training wall passes the best wall to target so "
        "far (it cannot come first then; SB3's rl-zoo3 BipedalWalker needs millions of steps)",
    )
    parser.add_argument("--give-up-after-s", type=float, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--worker", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.merge:  # long runs go one seed at a time (or resume after a stop); one table for all of them
        merged = [r for path in args.merge for r in json.loads(Path(path).read_text())["results"]]
        return write_outputs(merged, REPO / args.out)
    envs = [e for e in args.envs.split(",") if e]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    frameworks = [fw for fw in args.frameworks.split(",") if fw]
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    if args.race and not args.stop_at_target:
        parser.error("--race needs --stop-at-target")
    if args.worker:
        steps = args.steps or int(preset(envs[0]).get("total_steps", 50_000))
        worker(args.worker, envs[0], steps, seeds[0], args.eval_episodes, args.eval_every_steps, Path(args.out),
               args.stop_at_target, args.give_up_at or None, args.give_up_after_s)  # fmt: skip
        return 0

    out_dir = REPO / args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for env_id in envs:
        steps = args.steps or int(preset(env_id).get("total_steps", 50_000))
        one_iteration = parse_config(["--env-id", env_id]).batch_size
        for fw in (fw for fw in frameworks if fw in WARM_CACHE):
            for _ in range(2):
                run_one(fw, env_id, one_iteration, 0, args.eval_episodes, args.eval_every_steps, out_dir)
            print(f"{fw}: compile cache warmed for {env_id} (two one-iteration runs; not measured)", flush=True)
        # Frameworks interleaved per seed, so a load change on the shared machine hits all of them alike; rotated
        # round by round, so none always runs first (right after the previous seed's last run).
        for seed in seeds:
            for k in range(args.rounds):
                turn = 0 if args.race else k % len(frameworks)
                order = frameworks[turn:] + frameworks[:turn]
                best: float | None = None  # --race: the best wall to target of this seed and round so far
                for fw in order:
                    r = run_one(fw, env_id, steps, seed, args.eval_episodes, args.eval_every_steps, out_dir, k + 1,
                                args.stop_at_target, args.give_up_at, best)  # fmt: skip
                    if args.race and r["wall_to_target"] is not None:
                        best = r["wall_to_target"] if best is None else min(best, r["wall_to_target"])
                    print(
                        f"{fw:5s} {env_id} seed {seed} round {k + 1}: steady {r['sps_steady']:,.0f} SPS, "
                        f"total {r['total_time']:.1f}s, steps to thr {fmt(r['steps_to_threshold'])}, "
                        f"to eval thr {fmt(r['steps_to_eval_threshold'])}, eval {fmt(r['eval_mean'], 1)}, "
                        f"wall to target {fmt(r['wall_to_target'], 1)}",
                        flush=True,
                    )
                    results.append(r)
                    (out_dir / "train_throughput.json").write_text(json.dumps({"results": results}, indent=1))
    return write_outputs(results, out_dir)


def write_outputs(results: list[dict[str, Any]], out_dir: Path) -> int:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "train_throughput.json").write_text(json.dumps({"results": results}, indent=1))
    hosts = sorted({r.get("host", "not recorded") for r in results})
    table = f"Host{'s' if len(hosts) > 1 else ''}: {'; '.join(hosts)}.\n\n{tables(results)}"
    (out_dir / "train_throughput.md").write_text(table + "\n")
    plot(results, out_dir / "reward_curves.png")
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
