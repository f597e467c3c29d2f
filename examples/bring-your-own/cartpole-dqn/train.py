"""Train the CartPole ``QNet`` for a short while with a plain MindSpore DQN (replay buffer, target network,
ε-greedy on the host), then export it with plain ``mindspore.export``.

    python train.py --steps 5000

Writes ``qnet.ckpt`` and ``qnet.mindir``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gymnasium as gym
import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops
from qnet import QNet

HERE = Path(__file__).resolve().parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5000, help="env steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=HERE)
    args = p.parse_args()
    ms.set_device("CPU")
    ms.set_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    env = gym.make("CartPole-v1")
    q, target = QNet(), QNet()
    ms.load_param_into_net(target, {p.name: p for p in q.get_parameters()})
    optimizer = nn.Adam(q.trainable_params(), learning_rate=1e-3)

    def loss_fn(x: Tensor, a: Tensor, y: Tensor) -> Tensor:
        chosen = ops.gather_elements(q(x), 1, a.reshape(-1, 1)).squeeze(-1)
        return ops.smooth_l1_loss(chosen, y).mean()

    grad_fn = ms.value_and_grad(loss_fn, None, optimizer.parameters)
    buf_obs, buf_act, buf_rew, buf_next, buf_done = [], [], [], [], []
    obs, _ = env.reset(seed=args.seed)
    episode_return, returns = 0.0, []
    for step in range(args.steps):
        epsilon = max(0.05, 1.0 - step / (0.5 * args.steps))
        if rng.random() < epsilon:
            action = int(rng.integers(2))
        else:
            action = int(q(Tensor(obs[None].astype(np.float32))).asnumpy().argmax())
        next_obs, reward, term, trunc, _ = env.step(action)
        buf_obs.append(obs), buf_act.append(action), buf_rew.append(reward)
        buf_next.append(next_obs), buf_done.append(term)
        episode_return += reward
        obs = next_obs
        if term or trunc:
            returns.append(episode_return)
            episode_return = 0.0
            obs, _ = env.reset()
        if step >= 500 and step % 4 == 0:
            idx = rng.integers(len(buf_obs), size=64)
            x = np.asarray(buf_obs, np.float32)[idx]
            nxt = np.asarray(buf_next, np.float32)[idx]
            q_next = target(Tensor(nxt)).asnumpy().max(1)
            y = np.asarray(buf_rew, np.float32)[idx] + 0.99 * q_next * (1.0 - np.asarray(buf_done, np.float32)[idx])
            _, grads = grad_fn(Tensor(x), Tensor(np.asarray(buf_act, np.int32)[idx]), Tensor(y.astype(np.float32)))
            optimizer(grads)
        if step % 500 == 0:
            ms.load_param_into_net(target, {p.name: p for p in q.get_parameters()})
            recent = np.mean(returns[-10:]) if returns else float("nan")
            print(f"step {step}: mean return of the last 10 episodes {recent:.1f}")
    args.out.mkdir(parents=True, exist_ok=True)
    ms.save_checkpoint(q, str(args.out / "qnet.ckpt"))
    ms.export(q, Tensor(shape=[None, 4], dtype=ms.float32), file_name=str(args.out / "qnet"), file_format="MINDIR")
    print(f"wrote {args.out}/qnet.ckpt, qnet.mindir")


if __name__ == "__main__":
    main()
