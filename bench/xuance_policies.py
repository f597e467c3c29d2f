"""XuanCe's MindSpore policies as published, through export and verify: the table of
``bench/results/xuance_policies.md``.

    git clone https://github.com/agi-brain/xuance /tmp/xuance      # a scratch checkout, never in this repository
    python bench/xuance_policies.py --xuance /tmp/xuance --work /tmp/xuance-work [--only DQN,DRQN]

XuanCe's package imports YAML handling, its runners and PyTorch (its Dreamer module) at import; as for the MindSpore RL
library (``mindrl_actors.py``), its modules are imported from the checkout with each top-level statement that fails to
import skipped, and the policies' own code runs unchanged. Each policy is built as XuanCe's configs build it (a
``Basic_MLP`` representation, ReLU, the configs' layer sizes), seeded, then exported and verified in a child process:
the genuine weights, then the first element of its first Parameter + 0.05. A policy's outputs are named in a contract as
the policy returns them (XuanCe returns the representation's output first); no adapter Cell.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mindrl_actors import Actor, run_children, run_one, table

CARTPOLE = {"env_id": "CartPole-v1", "input": {"obs": [4]}}
PENDULUM = {"env_id": "Pendulum-v1", "input": {"obs": [3]}}
MLP = "r.Basic_MLP((4,), [64], activation=nn.ReLU)"
MLP3 = "r.Basic_MLP((3,), [64], activation=nn.ReLU)"
BOX = "Box(-2.0, 2.0, (1,), np.float32)"
GREEDY = {"outputs": {"names": ["state", "action", "q"]},
          "action": {"kind": "deterministic", "action": "action", "discrete": True}}  # fmt: skip
DRQN = {"input": {"obs": [1, 4]}, "state": {"h": {"shape": [1, 64], "next": "h_next", "init": "zeros"}},
        "outputs": {"names": ["state", "action", "q", "h_next"]},
        "action": {"kind": "deterministic", "action": "action", "discrete": True}}  # fmt: skip
POLICIES = [
    Actor("PG `categorical.ActorPolicy` 64-64 (logits)", "xuance.mindspore.policies.categorical",
          f"m.ActorPolicy(Discrete(2), {MLP}, [64], activation=nn.ReLU)",
          {**CARTPOLE, "outputs": {"names": ["state", "logits"]},
           "action": {"kind": "categorical", "logits": "logits"}}),
    Actor("PPO `categorical.ActorCriticPolicy` 64-64 (logits, value)", "xuance.mindspore.policies.categorical",
          f"m.ActorCriticPolicy(Discrete(2), {MLP}, [64], [64], activation=nn.ReLU)",
          {**CARTPOLE, "outputs": {"names": ["state", "logits", "value"], "value": "value"},
           "action": {"kind": "categorical", "logits": "logits"}}),
    Actor("DQN `BasicQnetwork` 64-64 (argmax action, Q)", "xuance.mindspore.policies.deterministic",
          f"m.BasicQnetwork(Discrete(2), {MLP}, [64], activation=nn.ReLU)", {**CARTPOLE, **GREEDY}),
    Actor("Dueling DQN `DuelQnetwork` 64-64", "xuance.mindspore.policies.deterministic",
          f"m.DuelQnetwork(Discrete(2), {MLP}, [64], activation=nn.ReLU)", {**CARTPOLE, **GREEDY}),
    Actor("DDPG `DDPGPolicy` 64-64 (action)", "xuance.mindspore.policies.deterministic",
          f"m.DDPGPolicy({BOX}, {MLP3}, [64], [64], activation=nn.ReLU, activation_action=nn.Tanh)",
          {**PENDULUM, "outputs": {"names": ["state", "action"]},
           "action": {"kind": "deterministic", "action": "action", "squash": "clip", "rescale": True, "low": [-2.0],
                      "high": [2.0]}}),
    Actor("PPO `gaussian.ActorCriticPolicy` 64-64 (mean, std, value)", "xuance.mindspore.policies.gaussian",
          f"m.ActorCriticPolicy({BOX}, {MLP3}, [64], [64], activation=nn.ReLU, activation_action=nn.Tanh)",
          {**PENDULUM, "outputs": {"names": ["state", "mean", "std", "value"], "value": "value"},
           "action": {"kind": "gaussian", "mean": "mean", "std": "std", "squash": "clip", "low": [-2.0],
                      "high": [2.0]}}),
    Actor("SAC `gaussian.SACPolicy` 64-64 (samples inside: `ops.normal`)", "xuance.mindspore.policies.gaussian",
          f"m.SACPolicy({BOX}, {MLP3}, [64], [64], activation=nn.ReLU, activation_action=nn.Tanh)",
          {**PENDULUM, "outputs": {"names": ["state", "action", "log_prob"]},
           "action": {"kind": "deterministic", "action": "action", "squash": "clip", "rescale": True, "low": [-2.0],
                      "high": [2.0]}}, note="draws its noise inside the graph (`ops.normal`)"),
    Actor("DRQN `DRQNPolicy` GRU 64 (one step, carried state)", "xuance.mindspore.policies.deterministic",
          f"m.DRQNPolicy(Discrete(2), {MLP}, rnn='GRU', recurrent_hidden_size=64, recurrent_layer_N=1, dropout=0, "
          "initialize=None)", DRQN, observations=(1, 4)),
]  # fmt: skip
PRELUDE = ("from gymnasium.spaces import Box, Discrete\n"
           "import xuance.mindspore.representations.mlp as r\n")  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--xuance", type=Path, required=True, help="a checkout of agi-brain/xuance (outside the repo)")
    p.add_argument("--work", type=Path, required=True, help="scratch directory for the bundles")
    p.add_argument("--observations", type=int, default=1000)
    p.add_argument("--episodes", type=int, default=3)
    p.add_argument("--only", default="", help="comma-separated prefixes of policy names")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child process: one policy, a JSON line
    args = p.parse_args()
    if args.one is not None:
        actor = POLICIES[args.one]
        row = run_one(actor, args.xuance.resolve(), args.work.resolve() / str(args.one), args.observations,
                      args.episodes, package="xuance", prelude=PRELUDE)  # fmt: skip
        print("ROW " + json.dumps(row.__dict__))
        return 0
    rows = run_children(__file__, POLICIES, args.only, ["--xuance", str(args.xuance), "--work", str(args.work),
                        "--observations", str(args.observations), "--episodes", str(args.episodes)])  # fmt: skip
    print()
    print(table(rows, "XuanCe"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
