"""Where a PPO iteration's time goes: one act call and one minibatch update, ours vs the PyTorch twin.

Both frameworks run the env preset's shapes (``num_envs`` observations per act call, ``batch_size /
num_minibatches`` rows per update) on synthetic rollout data: these small MLPs cost the same whatever the
values. Each framework runs in its own subprocess. Ours is timed through ``Cell.__call__`` and through
``compat.CompiledCall`` (what the Trainer uses), so the table also shows what the shortcut saves. The last
rows estimate one PPO iteration (``num_steps`` act calls + all minibatch updates, env time excluded).

    .venv/bin/python bench/update_cost.py --env CartPole-v1 --repeats 200
    .venv/bin/python bench/update_cost.py --precisions fp32,fp16 --ours-only   # ours' update per --update-precision
    .venv/bin/python bench/update_cost.py --env Pendulum-v1 --anatomy          # ours' update, stage by stage
    .venv/bin/python bench/update_cost.py --env Pendulum-v1 --graph-kernel     # ours with MindSpore's kernel fusion

``--anatomy`` cuts ours' minibatch update after each stage (the policy MLPs' forward and backward under a stand-in
loss, then PPO's loss, the gradient clip, Adam) and times the cut graphs side by side: which stage a change would
have to shrink.

``--graph-kernel`` times ours with and without MindSpore's graph-kernel fusion (AKG compiles fused kernels on the
CPU), one process per setting and round, alternating, and reports the first calls' compile seconds too.
The Trainer uses it with ``--graph-kernel true`` (Pendulum's preset): ``results/graph_kernel.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from train_throughput import preset  # noqa: E402

from msrl_consistency.config import parse_config  # noqa: E402  (no MindSpore import here)


def seconds_per_call(fns: dict[str, Callable[[], Any]], repeats: int, rounds: int = 5) -> dict[str, float]:
    """Best mean over ``repeats`` calls of each function, rounds interleaved so load drifts hit all alike.

    The first calls compile, so each function is warmed up first.
    """
    for fn in fns.values():
        for _ in range(5):
            fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(repeats):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / repeats)
    return best


def synthetic_rollout(rng: np.random.Generator, batch: int, obs_dim: int, act_shape: tuple[int, ...], discrete: bool):
    obs = rng.standard_normal((batch, obs_dim)).astype(np.float32)
    actions = (rng.integers(0, 2, batch) if discrete else rng.standard_normal((batch, *act_shape))).astype(np.float32)
    logp = np.full(batch, -0.7, np.float32)
    adv, returns, values = (rng.standard_normal(batch).astype(np.float32) for _ in range(3))
    return obs, actions, logp, adv, returns, values, np.ones(batch, np.float32)  # is_weights: the learner acted


def ours_on_synthetic_data(env_id: str, precision: str = "fp32") -> tuple[Any, Any, Any, np.random.Generator, list]:
    """(config, policy spec, learner, rng, rollout tensors): exactly the Cells the Trainer builds, one op thread."""
    from mindspore import Tensor

    from msrl_consistency import compat
    from msrl_consistency.envs import describe_env
    from msrl_consistency.training.loop import build_learner, build_spec

    cfg = parse_config(["--env-id", env_id, "--update-precision", precision])
    compat.set_device("cpu")
    compat.set_threads(1)
    compat.use_graph_mode()
    spec = build_spec(cfg, describe_env(env_id))
    learner = build_learner(cfg, spec)
    rng = np.random.default_rng(0)
    act_shape = () if spec.discrete else (spec.action_dim,)
    data = [Tensor(a) for a in synthetic_rollout(rng, cfg.batch_size, spec.obs_dim, act_shape, spec.discrete)]
    return cfg, spec, learner, rng, data


def run_ours(env_id: str, repeats: int, precision: str = "fp32", fused_kernels: bool = False) -> dict[str, float]:
    """Seconds per act call and per minibatch update; ``fused_kernels`` compiles both with graph-kernel fusion
    (``compat.graph_kernel_fusion``, what ``--graph-kernel true`` does)."""
    from mindspore import Tensor

    from msrl_consistency import compat

    started = time.perf_counter()
    cfg, spec, learner, rng, data = ours_on_synthetic_data(env_id, precision)
    rollout_net, step = learner.rollout_net, learner.train_step
    k = step.updates_per_call
    idx = np.stack([rng.permutation(cfg.batch_size)[: cfg.minibatch_size] for _ in range(k)]).astype(np.int32)
    obs = rng.standard_normal((cfg.num_envs, spec.obs_dim)).astype(np.float32)
    noise = spec.sample_noise(rng, cfg.num_envs)

    fast_act, fast_step = compat.CompiledCall(rollout_net), compat.CompiledCall(step)
    with compat.graph_kernel_fusion() if fused_kernels else contextlib.nullcontext():
        fast_act(Tensor(obs), Tensor(noise)).asnumpy()
        fast_step(*data, Tensor(idx)).asnumpy()
    compile_s = time.perf_counter() - started  # building the Cells and the first calls: mostly their compiles
    acts = seconds_per_call(
        {
            "act (Cell.__call__)": lambda: rollout_net(Tensor(obs), Tensor(noise)).asnumpy(),
            "act (CompiledCall)": lambda: fast_act(Tensor(obs), Tensor(noise)).asnumpy(),
        },
        repeats,
    )
    calls = seconds_per_call(
        {
            "update (Cell.__call__)": lambda: step(*data, Tensor(idx)).asnumpy(),
            "update (CompiledCall)": lambda: fast_step(*data, Tensor(idx)).asnumpy(),
        },
        max(1, repeats // k),
    )
    return {**acts, **{name: t / k for name, t in calls.items()}, "compile": compile_s}  # per minibatch update


ANATOMY = (
    ("mlp", "policy MLPs, forward + backward (stand-in loss)"),
    ("loss", "+ PPO loss, forward + backward"),
    ("clip", "+ gradient clip (global norm)"),
    ("adam", "+ Adam: the whole minibatch update"),
)


def run_anatomy(env_id: str, repeats: int) -> dict[str, float]:
    """Seconds per minibatch update cut after each ``ANATOMY`` stage (one update per call, same Cells as training)."""
    from mindspore import Tensor

    from msrl_consistency import compat

    cfg, _, learner, rng, data = ours_on_synthetic_data(env_id)
    step = learner.train_step
    idx = Tensor(rng.permutation(cfg.batch_size)[None, : cfg.minibatch_size].astype(np.int32))
    calls = {name: compat.CompiledCall(_update_until(step, name)) for name, _ in ANATOMY}
    return seconds_per_call({name: lambda c=c: c(*data, idx).asnumpy() for name, c in calls.items()}, repeats)


def _update_until(step: Any, stage: str) -> Any:
    """``step``'s first minibatch update, cut after ``stage`` (a Cell sharing ``step``'s Parameters)."""
    import mindspore as ms
    from mindspore import nn, ops

    from msrl_consistency.training.ppo import clip_by_global_norm

    class StandInLoss(nn.Cell):
        """Reads every policy output linearly: the MLPs' kernels and their backward, none of PPO's arithmetic."""

        def __init__(self, policy: Any) -> None:
            super().__init__()
            self.policy = policy

        def construct(self, x, actions, old_logp, adv, returns, old_values):  # noqa: ANN001, ANN202
            param, value = self.policy.trunks(x)
            out = param.mean() + value.mean()
            if not self.policy.discrete:
                out = out + self.policy.log_std.sum()
            return out

    class UpdateUntil(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.step = step
            self.stand_in = ms.value_and_grad(StandInLoss(step.loss_net.policy), None, step.optimizer.parameters)

        def construct(self, obs, actions, logp, adv, returns, values, idx):  # noqa: ANN001, ANN202
            s = self.step
            x = ops.stop_gradient(s.normalizer(obs))
            actions = s.loss_net.policy.prepare_actions(actions)
            i = idx[0]
            batch = (ops.gather(x, i, 0), ops.gather(actions, i, 0), ops.gather(logp, i, 0), ops.gather(adv, i, 0),
                     ops.gather(returns, i, 0), ops.gather(values, i, 0))  # fmt: skip
            if stage == "mlp":
                loss, grads = self.stand_in(*batch)
                return ops.depend(loss, grads)
            (_, aux), grads = s.grad_fn(*batch)
            if stage == "loss":
                return ops.depend(aux, grads)
            grads = clip_by_global_norm(grads, s.max_grad_norm)
            if stage == "clip":
                return ops.depend(aux, grads)
            return ops.depend(aux, s.optimizer(grads))

    return UpdateUntil()


def run_torch(env_id: str, repeats: int) -> dict[str, float]:
    import gymnasium as gym
    import torch
    import torch_ppo

    torch.set_num_threads(1)
    hp = torch_ppo.HParams.from_dict({k: v for k, v in preset(env_id).items() if k not in torch_ppo.IGNORED_KEYS})
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id) for _ in range(hp.num_envs)])
    agent = torch_ppo.Agent(envs, hp)
    optimizer = torch.optim.Adam(agent.parameters(), lr=hp.learning_rate, eps=1e-5)
    batch = hp.num_envs * hp.num_steps
    rng = np.random.default_rng(0)
    act_shape = () if agent.discrete else envs.single_action_space.shape
    rollout = tuple(torch.from_numpy(a) for a in synthetic_rollout(rng, batch, agent.obs_mean.numel(), act_shape,
                                                                    agent.discrete))  # fmt: skip
    obs = rng.standard_normal((hp.num_envs, agent.obs_mean.numel())).astype(np.float32)
    envs.close()

    def act() -> None:
        with torch.no_grad():
            action, logp, value = agent.act(torch.from_numpy(obs))
        action.numpy(), logp.numpy(), value.numpy()

    def update() -> None:
        torch_ppo.minibatch_update(agent, optimizer, hp, rollout, torch.randperm(batch)[: batch // hp.num_minibatches])

    return seconds_per_call({"act": act, "update": update}, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--repeats", type=int, default=200, help="calls per timing round (best of 5 rounds)")
    parser.add_argument("--precisions", default="fp32", help="ours' --update-precision values to time, e.g. fp32,fp16")
    parser.add_argument("--ours-only", action="store_true", help="skip the PyTorch twin (no bench extra needed)")
    parser.add_argument("--anatomy", action="store_true", help="ours' minibatch update, timed stage by stage")
    parser.add_argument("--graph-kernel", action="store_true", help="ours with and without graph-kernel fusion")
    parser.add_argument("--rounds", type=int, default=3, help="--graph-kernel: worker processes per setting")
    parser.add_argument("--worker", choices=["ours", "torch", "anatomy"], help=argparse.SUPPRESS)
    parser.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    parser.add_argument("--fused-kernels", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        runs = {
            "ours": lambda: run_ours(args.env, args.repeats, args.precision, args.fused_kernels),
            "torch": lambda: run_torch(args.env, args.repeats),
            "anatomy": lambda: run_anatomy(args.env, args.repeats),
        }
        result = runs[args.worker]()
        print(json.dumps(result))
        return

    def worker(name: str, precision: str = "fp32", fused_kernels: bool = False) -> dict[str, float]:
        cmd = [sys.executable, __file__, "--worker", name, "--env", args.env, "--repeats", str(args.repeats),
               "--precision", precision] + (["--fused-kernels"] if fused_kernels else [])  # fmt: skip
        out = subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    cfg = parse_config(["--env-id", args.env])
    if args.graph_kernel:
        runs = {False: [], True: []}
        for _ in range(args.rounds):
            for fused in (False, True):
                runs[fused].append(worker("ours", fused_kernels=fused))
        print_graph_kernel(args.env, cfg, runs, args.repeats)
        return
    if args.anatomy:
        print_anatomy(args.env, cfg, worker("anatomy"), args.repeats)
        return
    ours = worker("ours")
    if args.ours_only:
        print(f"{args.env}: ours, seconds per call, best of 5 rounds x {args.repeats}\n")
        print("| call | ours, Cell.__call__ | ours, CompiledCall |\n|---|---:|---:|")
        for label, key in ((f"act ({cfg.num_envs} obs)", "act"), (f"update ({cfg.minibatch_size} rows)", "update")):
            print(f"| {label} | {ms(ours[f'{key} (Cell.__call__)'])} | {ms(ours[f'{key} (CompiledCall)'])} |")
    else:
        torch_t = worker("torch")
        updates = cfg.num_minibatches * cfg.update_epochs
        print(f"{args.env}: seconds per call, best of 5 rounds x {args.repeats}; ratio = PyTorch / ours "
              "(>1: ours faster)\n")  # fmt: skip
        print("| call | PyTorch | ours, Cell.__call__ | ours, CompiledCall | ratio |")
        print("|---|---:|---:|---:|---:|")
        for label, key in ((f"act ({cfg.num_envs} obs)", "act"), (f"update ({cfg.minibatch_size} rows)", "update")):
            slow, fast = ours[f"{key} (Cell.__call__)"], ours[f"{key} (CompiledCall)"]
            print(f"| {label} | {ms(torch_t[key])} | {ms(slow)} | {ms(fast)} | {torch_t[key] / fast:.2f}x |")
        theirs = cfg.num_steps * torch_t["act"] + updates * torch_t["update"]
        mine = cfg.num_steps * ours["act (CompiledCall)"] + updates * ours["update (CompiledCall)"]
        label = f"iteration without env ({cfg.num_steps} acts + {updates} updates)"
        print(f"| {label} | {ms(theirs)} | | {ms(mine)} | {theirs / mine:.2f}x |")
    others = [p.strip() for p in args.precisions.split(",") if p.strip() and p.strip() != "fp32"]
    if others:
        print(
            f"\n{args.env}, ours, one minibatch update ({cfg.minibatch_size} rows), best of 5 rounds x {args.repeats}\n"
        )
        print("| --update-precision | update per minibatch (CompiledCall) | vs fp32 |\n|---|---:|---:|")
        base = ours["update (CompiledCall)"]
        print(f"| fp32 | {ms(base)} | 1.00x |")
        for precision in others:
            t = worker("ours", precision)["update (CompiledCall)"]
            print(f"| {precision} | {ms(t)} | {t / base:.2f}x |")


def print_anatomy(env_id: str, cfg: Any, seconds: dict[str, float], repeats: int) -> None:
    print(f"{env_id}: ours, one minibatch update ({cfg.minibatch_size} rows) cut after each stage, "
          f"best of 5 rounds x {repeats}\n")  # fmt: skip
    print("| update up to | ms per update | the stage adds | share of the update |\n|---|---:|---:|---:|")
    total, before = seconds["adam"], 0.0
    for name, label in ANATOMY:
        added = seconds[name] - before
        print(f"| {label} | {ms(seconds[name])} | {ms(added)} | {added / total:.0%} |")
        before = seconds[name]


def print_graph_kernel(env_id: str, cfg: Any, runs: dict[bool, list[dict[str, float]]], repeats: int) -> None:
    """Median over the worker processes of each setting; the ratio is per round (both settings' n-th processes)."""
    print(f"{env_id}: ours through CompiledCall, without and with graph-kernel fusion; {len(runs[False])} processes "
          f"per setting, alternating, each the best of 5 rounds x {repeats} calls; median (range)\n")  # fmt: skip
    print("| | without | with | with / without, per round |\n|---|---:|---:|---|")
    rows = (
        (f"act ({cfg.num_envs} obs)", "act (CompiledCall)", ms),
        (f"update ({cfg.minibatch_size} rows)", "update (CompiledCall)", ms),
        ("build + first calls (compile)", "compile", lambda s: f"{s:.2f} s"),
    )
    for label, key, fmt in rows:
        cells = []
        for fused in (False, True):
            values = [run[key] for run in runs[fused]]
            cells.append(f"{fmt(float(np.median(values)))} ({fmt(min(values))}-{fmt(max(values))})")
        ratios = ", ".join(f"{b[key] / a[key]:.2f}x" for a, b in zip(runs[False], runs[True], strict=True))
        print(f"| {label} | {cells[0]} | {cells[1]} | {ratios} |")


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


if __name__ == "__main__":
    main()
