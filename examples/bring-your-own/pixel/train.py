"""Train the pixel policy with plain MindSpore by imitating a hand-written CartPole controller on the camera
frames of the team's env, then save it: the way a team works without this toolkit.

    python train.py --steps 150

Writes ``policy.ckpt``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import mindspore as ms
import numpy as np
from mindspore import Tensor, nn
from pixel_env import make_env
from policy import HERE, make_policy


def frames(count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``count`` frames from the controller's episodes (10% random actions), labelled with its actions."""
    env = make_env()
    xs, ys = [], []
    frame, _ = env.reset(seed=int(rng.integers(1 << 30)))
    while len(xs) < count:
        state = env.unwrapped.state
        label = int(state[2] + 0.5 * state[3] > 0)
        xs.append(frame), ys.append(label)
        frame, _, term, trunc, _ = env.step(label if rng.random() > 0.1 else int(rng.integers(2)))
        if term or trunc:
            frame, _ = env.reset(seed=int(rng.integers(1 << 30)))
    return np.asarray(xs, np.uint8), np.asarray(ys, np.int32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=150, help="Adam steps, a batch of 64 frames each")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=HERE)
    args = p.parse_args()
    ms.set_device("CPU")
    ms.set_context(mode=ms.GRAPH_MODE)
    rng = np.random.default_rng(args.seed)
    net = make_policy()
    train_step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.CrossEntropyLoss()),
                                     nn.Adam(net.trainable_params(), learning_rate=3e-3))  # fmt: skip
    for step in range(args.steps):
        x, y = frames(64, rng)
        loss = train_step(Tensor(x), Tensor(y))
        if (step + 1) % 50 == 0:
            print(f"step {step + 1}/{args.steps}: loss {float(loss.asnumpy()):.3f}")
    args.out.mkdir(parents=True, exist_ok=True)
    ms.save_checkpoint(net, str(args.out / "policy.ckpt"))
    print(f"wrote {args.out}/policy.ckpt")


if __name__ == "__main__":
    main()
