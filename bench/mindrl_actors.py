"""The MindSpore RL library's actor networks as published, through export and verify: the table of
``bench/results/mindrl_actors.md``.

    git clone https://github.com/mindspore-lab/mindrl /tmp/mindrl        # a scratch checkout, never in this repository
    python bench/mindrl_actors.py --mindrl /tmp/mindrl --work /tmp/mindrl-work [--only DQN,C51]

The library cannot be imported as a whole on MindSpore 2.10 (its package ``__init__`` files import replay-buffer
primitives MindSpore removed, ``gym`` and its distributed code generator), so its modules are imported from the
checkout with each top-level statement that fails to import skipped (``TolerantImport``); the networks' own code runs
unchanged. Each actor is built with the sizes of the library's configs and seeded weights, then, in a child process:
``export_policy`` (MindIR, ONNX, Lite ``.ms`` and the self-check), ``verify_policy`` on the genuine weights and with
the first element of its first layer's first Parameter + 0.05 (``--observations`` seeded observations,
``--episodes`` episodes per mode, every runtime required). Envs the library trains on that are not on PyPI (MPE,
SMAC, DeepMind Control) are replaced by recorded observations (standard normal rows, seeded); the report then says
that no episode was replayed.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.abc
import importlib.util
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EVERY_RUNTIME = ("ms-graph", "ms-mindir", "lite", "onnxruntime")


class TolerantImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``package.*`` (``mindspore_rl`` by default) from ``root``, each module's top-level statements run one by one,
    the ones raising ImportError/AttributeError/NameError skipped (what they would have defined is then missing)."""

    def __init__(self, root: Path, package: str = "mindspore_rl") -> None:
        self.root, self.package, self.skipped = root, package, []

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self.package and not name.startswith(self.package + "."):
            return None
        base = self.root / Path(*name.split("."))
        if (base / "__init__.py").is_file():
            return importlib.util.spec_from_file_location(name, base / "__init__.py", loader=self,
                                                          submodule_search_locations=[str(base)])  # fmt: skip
        if base.with_suffix(".py").is_file():
            return importlib.util.spec_from_file_location(name, base.with_suffix(".py"), loader=self)
        return None

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        path = Path(module.__spec__.origin)
        for statement in ast.parse(path.read_text(), str(path)).body:
            try:
                exec(compile(ast.Module([statement], []), str(path), "exec"), module.__dict__)  # noqa: S102
            except (ImportError, AttributeError, NameError, RuntimeError) as exc:  # RuntimeError: a GPU device set
                self.skipped.append(f"{module.__name__}: {exc}")


@dataclass
class Actor:
    name: str  # the table's row
    module: str  # mindspore_rl.algorithm...
    build: str  # a Python expression over the module ``m`` (and ``np``, ``ms``, ``nn``) that builds the Cell
    contract: dict[str, Any]
    observations: int | tuple[int, ...] | None = None  # recorded observations of this shape instead of an env
    note: str = ""  # what the row shows, found by reading the library's code


CARTPOLE = {"env_id": "CartPole-v1", "input": {"obs": [4]}}
PENDULUM = {"env_id": "Pendulum-v1", "input": {"obs": [3]}}
GREEDY = {"outputs": {"names": ["q"]}, "action": {"kind": "argmax", "values": "q"}}
LOGITS = {"outputs": {"names": ["logits"]}, "action": {"kind": "categorical", "logits": "logits"}}
PROBS = {"outputs": {"names": ["probs"]}, "action": {"kind": "categorical", "probs": "probs"}}
SAC = {
    **PENDULUM,
    "outputs": {"names": ["mean", "std", "log_std", "action"]},
    "action": {"kind": "gaussian", "mean": "mean", "std": "std", "squash": "tanh", "low": [-2.0], "high": [2.0]},
}
TANH_ACTION = {**PENDULUM, "outputs": {"names": ["action"]},
               "action": {"kind": "deterministic", "action": "action", "squash": "clip", "rescale": True,
                          "low": [-2.0], "high": [2.0]}}  # fmt: skip
MPE, SMAC = 18, 80  # simple_spread's observation per agent; SMAC 2s3z's (COMA), 5 agents, 11 actions
ACTORS = [
    Actor("DQN `FullyConnectedNet` 4-100-2", "mindspore_rl.network.fully_connected_net",
          "m.FullyConnectedNet(4, 100, 2)", {**CARTPOLE, **GREEDY}),
    Actor("Double DQN (`DQNPolicy`'s `FullyConnectedNet` 4-100-2)", "mindspore_rl.algorithm.dqn.dqn",
          "m.DQNPolicy({'state_space_dim': 4, 'action_space_dim': 2, 'hidden_size': 100, 'compute_type': "
          "ms.float32, 'epsi_high': 0.1, 'epsi_low': 0.1, 'decay': 200}).policy_network", {**CARTPOLE, **GREEDY},
          note="Double DQN's config builds DQN's policy (`DQNPolicy`): only the learner differs"),
    Actor("Dueling DQN `DuelingNet` 4-100-2", "mindspore_rl.algorithm.dueling_dqn.dueling_dqn",
          "m.DuelingDQNPolicy.DuelingNet({'state_space_dim': 4, 'action_space_dim': 2, 'hidden_size': 100, "
          "'compute_type': ms.float32})", {**CARTPOLE, **GREEDY},
          note="the library: `ReduceMean(keep_dims=True)` without an axis averages the advantage over the whole "
               "batch, so a row's Q-values depend on the other rows"),
    Actor("C51 `FullyConnectedNet` 4-100-(2x51) (atom logits)", "mindspore_rl.algorithm.c51.fullyconnectednet_noisy",
          "m.FullyConnectedNet(4, 100, 2 * 51, 2, 51)",
          {**CARTPOLE, "outputs": {"names": ["logits"]}, "action": {"kind": "distributional", "logits": "logits",
                                                                     "atoms": 51, "support": [-10.0, 10.0]}}),
    Actor("PPO `PPOActorNet` 200-100 (6-dim mean, sigma)", "mindspore_rl.algorithm.ppo.ppo",
          "m.PPOPolicy.PPOActorNet(17, 200, 100, 6, 0.35)",
          {"env_id": "HalfCheetah-v5", "input": {"obs": [17]}, "outputs": {"names": ["mean", "std"]},
           "action": {"kind": "gaussian", "mean": "mean", "std": "std", "squash": "clip", "low": [-1.0],
                      "high": [1.0]}}),
    Actor("SAC `SACActorNet` 256-256, `conditioned_std=True`", "mindspore_rl.algorithm.sac.sac",
          "m.SACPolicy.SACActorNet(3, [256, 256], 1, conditioned_std=True)", SAC),
    Actor("SAC `SACActorNet` 256-256, `conditioned_std=False`", "mindspore_rl.algorithm.sac.sac",
          "m.SACPolicy.SACActorNet(3, [256, 256], 1, conditioned_std=False)", SAC),
    Actor("TD3 `TD3ActorNet` 400-300", "mindspore_rl.algorithm.td3.td3", "m.TD3Policy.TD3ActorNet(3, 400, 300, 1)",
          TANH_ACTION),
    Actor("DDPG `DDPGActorNet` 400-300", "mindspore_rl.algorithm.ddpg.ddpg",
          "m.DDPGPolicy.DDPGActorNet(3, 400, 300, 1)", TANH_ACTION),
    Actor("A2C `ActorCriticNet` 4-128-2 (logits, value)", "mindspore_rl.algorithm.a2c.a2c",
          "m.A2CPolicyAndNetwork.ActorCriticNet(4, 128, 2)",
          {**CARTPOLE, "outputs": {"names": ["logits", "value"], "value": "value"}, "action": LOGITS["action"]}),
    Actor("AC `ActorNet` 4-20-2 (softmax)", "mindspore_rl.algorithm.ac.ac", "m.ACPolicyAndNetwork.ActorNet(4, 20, 2)",
          {**CARTPOLE, **PROBS}),
    Actor("PG `ActorNet` 4-20-2 (softmax)", "mindspore_rl.algorithm.pg.pg", "m.PGPolicyAndNetwork.ActorNet(4, 20, 2)",
          {**CARTPOLE, **PROBS}),
    Actor("IMPALA `ActorCriticNet` 4-256-2 (logits, value)", "mindspore_rl.algorithm.impala.impala",
          "m.IMPALANetwork.ActorCriticNet(4, 256, 2)",
          {**CARTPOLE, "outputs": {"names": ["logits", "value"], "value": "value"}, "action": LOGITS["action"]}),
    Actor("MADDPG `MADDPGActorNet` 18-64-64-5", "mindspore_rl.algorithm.maddpg.maddpg",
          "m.MADDPGPolicy.MADDPGActorNet(18, 64, 5)", {"input": {"obs": [MPE]}, **LOGITS}, observations=MPE),
    Actor("QMIX `QMIXMPEPolicyNet` (LayerNorm, `nn.GRU` 64)", "mindspore_rl.algorithm.qmix.qmix",
          "m.QMIXPolicy.QMIXMPEPolicyNet({'hidden_size': 64, 'action_space_dim': 5, 'state_space_dim': 18, "
          "'compute_type': ms.float32, 'environment_config': {'num_agent': 3}})",
          {"input": {"obs": [MPE]}, "state": {"h": {"shape": [64], "next": "h_next"}},
           "outputs": {"names": ["q", "h_next"]}, "action": {"kind": "argmax", "values": "q"}}, observations=MPE),
    Actor("COMA `COMAPolicyNet` (`nn.GRU` 64)", "mindspore_rl.algorithm.coma.coma",
          "m.COMAPolicy.COMAPolicyNet({'hidden_size': 64, 'action_space_dim': 11, 'state_space_dim': 80, "
          "'environment_config': {'num_agent': 5}})",
          {"input": {"obs": [SMAC + 5 + 11]}, "state": {"h": {"shape": [64], "next": "h_next"}},
           "outputs": {"names": ["logits", "h_next"]}, "action": LOGITS["action"]}, observations=SMAC + 5 + 11),
    Actor("MAPPO `MAPPOActorNet` (LayerNorm x4, `GruNet`, masks)", "mindspore_rl.algorithm.mappo.mappo",
          "m.MAPPOPolicy.MAPPOActorNet({'state_space_dim': 18, 'action_space_dim': 5})",
          {"input": {"obs": [MPE], "masks": {"constant": 1.0, "shape": [1]}},
           "state": {"h": {"shape": [1, 64], "next": "h_next"}}, **{**LOGITS, "outputs": {"names": ["logits",
                                                                                                   "h_next"]}}},
          observations=MPE),
    Actor("Dreamer `ActionDecoder` 238-400x4-6 (`training=False`)", "mindspore_rl.algorithm.dreamer.models",
          "m.ActionDecoder({'dtype': ms.float32, 'action_decoder_layers': [238, 400, 400, 400, 400], 'size': 6, "
          "'min_std': 1e-4, 'mean_scale': 5, 'init_std': 5.0})",
          {"input": {"obs": [238], "training": {"constant": False}}, "outputs": {"names": ["action"]},
           "action": {"kind": "deterministic", "action": "action"}}, observations=238),
]  # fmt: skip


@dataclass
class Row:
    actor: str
    export: str = ""
    genuine: str = ""
    nudged: str = ""
    layers: dict[str, str | None] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0


def run_one(
    actor: Actor,
    root: Path,
    work: Path,
    observations: int,
    episodes: int,
    package: str = "mindspore_rl",
    prelude: str = "",
) -> Row:
    """Export and verify one actor of the library ``package`` checked out at ``root`` (in this process); ``prelude``:
    imports the actor's build expression uses."""
    import mindspore as ms
    import numpy as np
    from mindspore import nn

    from inference.compare.verifier import VerifyOptions
    from msrl_consistency import compat
    from msrl_consistency.api import export_policy, verify_policy
    from msrl_consistency.artifacts.bundle import ExportCheckFailed

    compat.set_device("cpu")  # before the library's modules run: some select a GPU at import
    sys.meta_path.insert(0, TolerantImport(root, package))
    module = importlib.import_module(actor.module)
    names = {"m": module, "np": np, "ms": ms, "nn": nn}
    exec(prelude, names)  # noqa: S102 - our own table

    def make() -> Any:
        ms.set_seed(11)
        return eval(actor.build, names)  # noqa: S307 - our own table

    row, start = Row(actor.name), time.perf_counter()
    out = work / actor.module.rsplit(".", 1)[-1] / "bundle"
    try:
        bundle = export_policy(make, actor.contract, out, force=True)
    except ExportCheckFailed as exc:
        bundle = exc.bundle
        row.failures.append(f"export: {exc}")
    except Exception as exc:  # noqa: BLE001 - a row of the table, whatever went wrong
        row.export, row.seconds = f"refused: {str(exc).splitlines()[0][:300]}", time.perf_counter() - start
        return row
    if bundle is None:
        row.export = "nothing written"
        return row
    files = bundle.graph("policy")["files"]
    kept = [fmt for fmt, e in files.items() if "file" in e and "failed" not in e]
    row.export = (
        "full bundle"
        if kept == ["mindir", "onnx", "ms"]
        else f"{', '.join(kept)} ("
        + "; ".join(f"{fmt}: {e.get('failed', e.get('skipped'))}" for fmt, e in files.items() if fmt not in kept)
        + ")"
    )
    recorded = None
    if actor.observations is not None:
        shape = (observations, *np.atleast_1d(actor.observations))
        recorded = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    options = VerifyOptions(observations=observations, episodes=episodes, seed=2, required=EVERY_RUNTIME)

    def verify(cell_factory: Any) -> Any:
        return verify_policy(cell_factory, None, bundle.root, observations=recorded, options=options)

    try:
        genuine = verify(make)
        row.genuine = str(genuine.exit_code)
        row.failures += [f"genuine: {c.runtime} {c.name}: {c.summary}" for c in genuine.failed]

        def nudged() -> Any:
            cell = make()
            param = next(p for name, p in cell.parameters_and_names() if "." in name)  # the first layer's weight
            value = param.asnumpy().copy()
            value.flat[0] += 0.05
            param.set_data(ms.Tensor(value))
            return cell

        result = verify(nudged)
        row.nudged = str(result.exit_code)
        row.failures += [f"nudged: {c.runtime} {c.name}: {c.summary}" for c in result.failed[:4]]
        row.layers = {rt: loc.first for rt, loc in result.localizations.items()}
    except Exception as exc:  # noqa: BLE001
        row.failures.append(f"verify: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
    row.seconds = time.perf_counter() - start
    return row


def table(rows: list[Row], library: str = "MindSpore RL") -> str:
    lines = [f"| actor ({library}) | export | verify genuine / nudged | layer named (nudged: lite, onnxruntime, "
             "ms-mindir) |", "|---|---|---|---|"]  # fmt: skip
    for r in rows:
        named = ", ".join(str(r.layers.get(rt)) for rt in ("lite", "onnxruntime", "ms-mindir")) if r.layers else "-"
        lines.append(f"| {r.actor} | {r.export} | {r.genuine or '-'} / {r.nudged or '-'} | {named} |")
    return "\n".join(lines)


def run_children(script: str, actors: list[Actor], only: str, argv: list[str]) -> list[Row]:
    """Each actor (whose name starts with one of ``only``'s prefixes) exported and verified in its own process:
    ``script --one INDEX *argv`` prints its row as a JSON line; a child that dies is a row saying how."""
    rows = []
    for index, actor in enumerate(actors):
        if only and not any(actor.name.startswith(o) for o in only.split(",")):
            continue
        proc = subprocess.run([sys.executable, script, "--one", str(index), *argv], capture_output=True, text=True,
                              cwd=REPO)  # fmt: skip
        found = [line[4:] for line in proc.stdout.splitlines() if line.startswith("ROW ")]
        last = (proc.stderr.strip().splitlines() or [""])[-1][:300]
        row = (
            Row(**json.loads(found[0]))
            if found
            else Row(actor.name, export=f"crashed (exit {proc.returncode}): {last}")
        )
        rows.append(row)
        print(f"{actor.name}: export {row.export[:80]}; {row.genuine} / {row.nudged}; {row.layers} "
              f"({row.seconds:.0f} s)", flush=True)  # fmt: skip
        for failure in row.failures:
            print(f"    {failure[:400]}", flush=True)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mindrl", type=Path, required=True, help="a checkout of mindspore-lab/mindrl (outside the repo)")
    p.add_argument("--work", type=Path, required=True, help="scratch directory for the bundles")
    p.add_argument("--observations", type=int, default=1000)
    p.add_argument("--episodes", type=int, default=3)
    p.add_argument("--only", default="", help="comma-separated prefixes of actor names")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child process: one actor, a JSON line
    args = p.parse_args()
    if args.one is not None:
        row = run_one(ACTORS[args.one], args.mindrl.resolve(), args.work.resolve(), args.observations, args.episodes)
        print("ROW " + json.dumps(row.__dict__))
        return 0
    rows = run_children(__file__, ACTORS, args.only, ["--mindrl", str(args.mindrl), "--work", str(args.work),
                        "--observations", str(args.observations), "--episodes", str(args.episodes)])  # fmt: skip
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
