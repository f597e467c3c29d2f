"""Train the Pendulum ``PolicyNet`` for a short while with plain MindSpore, then export it with plain
``mindspore.export``: the way a team works without this toolkit.

    python train.py --iterations 10

Writes ``policy.ckpt`` (the bare net), ``obs_stats.npz`` (host-side normalisation statistics),
``policy_model.mindir`` (exported export-safe: normalisation in the graph) and ``policy_model_bare.mindir``
(the common mistake: the bare net, normalisation left on the host).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gymnasium as gym
import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops
from policy import HERE, PolicyNet

CLIP = 10.0


def normalize(obs: np.ndarray, mean: np.ndarray, var: np.ndarray) -> np.ndarray:
    """The team's host-side preprocessing (float32, like the export-safe wrapper computes it in the graph)."""
    return np.clip((obs - mean) / np.sqrt(var + np.float32(1e-8)), -CLIP, CLIP).astype(np.float32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=10, help="policy-gradient updates (one batch of episodes each)")
    p.add_argument("--episodes", type=int, default=4, help="episodes per update")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=HERE)
    args = p.parse_args()
    ms.set_device("CPU")
    ms.set_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    env = gym.make("Pendulum-v1")

    # Observation statistics from random play, frozen for the whole training (the team's choice).
    seen = [env.reset(seed=args.seed)[0]]
    for _ in range(2000):
        obs, _, term, trunc, _ = env.step(env.action_space.sample())
        seen.append(obs if not (term or trunc) else env.reset()[0])
    mean, var = np.mean(seen, 0).astype(np.float32), np.var(seen, 0).astype(np.float32)

    net = PolicyNet()
    optimizer = nn.Adam(net.trainable_params(), learning_rate=3e-3)

    def loss_fn(x: Tensor, actions: Tensor, advantages: Tensor) -> Tensor:
        mu, std = net(x)
        log_prob = (-0.5 * ((actions - mu) / std) ** 2 - ops.log(std)).sum(-1)
        return -(log_prob * advantages).mean()

    grad_fn = ms.value_and_grad(loss_fn, None, optimizer.parameters)
    for it in range(args.iterations):
        xs, acts, rets = [], [], []
        for ep in range(args.episodes):
            obs, _ = env.reset(seed=args.seed + 1000 * it + ep)
            rewards, done = [], False
            while not done:
                x = normalize(obs[None].astype(np.float32), mean, var)
                mu, std = (t.asnumpy() for t in net(Tensor(x)))
                action = np.clip(mu + std * rng.standard_normal(mu.shape), -2.0, 2.0).astype(np.float32)
                obs, reward, term, trunc, _ = env.step(action[0])
                xs.append(x[0]), acts.append(action[0]), rewards.append(reward)
                done = term or trunc
            g, returns = 0.0, []
            for r in reversed(rewards):
                g = r + 0.99 * g
                returns.append(g)
            rets += returns[::-1]
        adv = np.asarray(rets, np.float32)
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        loss, grads = grad_fn(Tensor(np.stack(xs)), Tensor(np.stack(acts)), Tensor(adv))
        optimizer(grads)
        print(f"iteration {it + 1}/{args.iterations}: loss {float(loss.asnumpy()):.3f}")

    args.out.mkdir(parents=True, exist_ok=True)
    np.savez(args.out / "obs_stats.npz", mean=mean, var=var)
    ms.save_checkpoint(net, str(args.out / "policy.ckpt"))
    spec = Tensor(shape=[None, 3], dtype=ms.float32)
    from msrl_consistency.agent.export_safe import NormalizeObservation  # the one line that makes export safe

    ms.export(NormalizeObservation(net, mean, var, clip=CLIP), spec, file_name=str(args.out / "policy_model"),
              file_format="MINDIR")  # fmt: skip
    ms.export(net, spec, file_name=str(args.out / "policy_model_bare"), file_format="MINDIR")
    print(f"wrote {args.out}/policy.ckpt, obs_stats.npz, policy_model.mindir, policy_model_bare.mindir")


if __name__ == "__main__":
    main()
