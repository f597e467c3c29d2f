"""Train the GRU policy with plain MindSpore by imitating a hand-written CartPole controller, then save it: the
way a team works without this toolkit.

    python train.py --steps 150

The controller pushes toward the side the pole falls to (angle plus half its angular velocity); the GRU learns
it from the observations it sees step by step, through its hidden state (truncated backpropagation through
sequences of 16 steps). Writes ``policy.ckpt``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gymnasium as gym
import mindspore as ms
import numpy as np
from mindspore import Tensor, nn, ops
from policy import HERE, HIDDEN, make_policy

SEQ = 16


def controller(obs: np.ndarray) -> int:
    return int(obs[2] + 0.5 * obs[3] > 0)


def sequences(env: gym.Env, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``count`` sequences of SEQ observations from the controller's episodes (with 10% random actions)."""
    obs_seqs, act_seqs = [], []
    obs, _ = env.reset(seed=int(rng.integers(1 << 30)))
    while len(obs_seqs) < count:
        xs, ys = [], []
        for _ in range(SEQ):
            label = controller(obs)
            xs.append(obs), ys.append(label)
            act = label if rng.random() > 0.1 else int(rng.integers(2))
            obs, _, term, trunc, _ = env.step(act)
            if term or trunc:
                obs, _ = env.reset(seed=int(rng.integers(1 << 30)))
        obs_seqs.append(xs), act_seqs.append(ys)
    return np.asarray(obs_seqs, np.float32), np.asarray(act_seqs, np.int32)


class SequenceLoss(nn.Cell):
    """Cross entropy against the controller's actions along each sequence, the state carried through it."""

    def __init__(self, net: nn.Cell) -> None:
        super().__init__(auto_prefix=False)  # the policy's Parameters keep their own names in the checkpoint
        self.net = net

    def construct(self, obs: Tensor, labels: Tensor) -> Tensor:
        h = ops.zeros((obs.shape[0], HIDDEN), ms.float32)
        loss = 0.0
        for t in range(SEQ):
            logits, h = self.net(obs[:, t], h)
            loss = loss + ops.cross_entropy(logits, labels[:, t])
        return loss / SEQ


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150, help="Adam steps, a batch of 32 sequences each")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=HERE)
    args = p.parse_args()
    ms.set_device("CPU")
    rng = np.random.default_rng(args.seed)
    env = gym.make("CartPole-v1")
    net = make_policy()
    train_step = nn.TrainOneStepCell(SequenceLoss(net), nn.Adam(net.trainable_params(), learning_rate=1e-2))
    ms.set_context(mode=ms.GRAPH_MODE)  # the unrolled sequence compiles once; PyNative would take minutes
    for step in range(args.steps):
        obs, labels = sequences(env, 32, rng)
        loss = train_step(Tensor(obs), Tensor(labels))
        if (step + 1) % 50 == 0:
            print(f"step {step + 1}/{args.steps}: loss {float(loss.asnumpy()):.3f}")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    args.out.mkdir(parents=True, exist_ok=True)
    ms.save_checkpoint(net, str(args.out / "policy.ckpt"))
    print(f"wrote {args.out}/policy.ckpt")


if __name__ == "__main__":
    main()
