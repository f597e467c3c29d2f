"""What acting through ONNX Runtime costs in training, and the ways the learner's weights can reach it.

For the rollout graph a run acts through (``RolloutPolicy`` at the run's batch of envs, each env's preset), one act
call per way, and one weight push per way after an update:

* ``mindspore``: the learner's compiled graph (``--rollout-engine mindspore``); nothing to push;
* ``onnxruntime, weights as inputs, run()``: every Parameter a graph input, fed with each call;
* ``onnxruntime, weights as inputs, I/O binding``: the same inputs bound once to this process's buffers (what
  ``--rollout-engine onnxruntime`` does): a push is a copy into the buffers;
* ``onnxruntime, initializers``: the exported graph as written; a push replaces the initializers in memory and
  builds a new session;
* a full re-export per push (``write_onnx`` of the rollout Cell, then a session).

Prints per-call p50 (µs) and per-push cost (ms) against the MindSpore act call of the same run, and the cost of
one iteration's acting at the preset's ``num_steps``.

    python bench/rollout_engine.py [--envs CartPole-v1,Pendulum-v1] [--calls 5000]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from inference.machine.facts import measured_here


def p50_us(fn, calls: int) -> float:  # noqa: ANN001
    for _ in range(200):
        fn()
    lat = np.empty(calls)
    for i in range(calls):
        t = time.perf_counter()
        fn()
        lat[i] = time.perf_counter() - t
    return float(np.median(lat) * 1e6)


def mean_ms(fn, repeats: int) -> float:  # noqa: ANN001
    fn()
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t) / repeats * 1e3


def measure(env_id: str, calls: int) -> list[tuple[str, float, float | None]]:
    import onnx
    import onnxruntime as ort

    from msrl_consistency import compat
    from msrl_consistency.agent import RolloutPolicy
    from msrl_consistency.config import parse_config
    from msrl_consistency.envs import describe_env
    from msrl_consistency.training.learner import build_learner, build_spec
    from msrl_consistency.training.rollout import engines

    cfg = parse_config(["--env-id", env_id])
    compat.set_threads(1)
    compat.use_graph_mode()
    spec = build_spec(cfg, describe_env(env_id))
    learner = build_learner(cfg, spec)
    rng = np.random.default_rng(0)
    obs = rng.standard_normal((cfg.num_envs, spec.obs_dim)).astype(np.float32)
    noise = spec.sample_noise(rng, cfg.num_envs)
    ms_engine = engines.MindSporeEngine(learner.rollout_net)
    bound = engines.OnnxRuntimeEngine(learner.rollout_net, spec, cfg.num_envs)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    lifted = bound.session  # the same graph, called with every weight fed
    feeds = {"obs": obs, "noise": noise, **bound.weights}
    work = Path(tempfile.mkdtemp())
    try:
        from msrl_consistency.artifacts.graphs import write_onnx

        graph = engines.rollout_graph(spec)
        path = write_onnx(RolloutPolicy(learner.policy), graph, work / "rollout.onnx")
        model = onnx.load(str(path))
        plain = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        params = dict(bound.params)

        def rebuild() -> None:
            for init in model.graph.initializer:
                if init.name in params:
                    init.CopyFrom(onnx.numpy_helper.from_array(params[init.name].asnumpy(), init.name))
            ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])

        def reexport() -> None:
            write_onnx(RolloutPolicy(learner.policy), graph, work / "again.onnx")
            ort.InferenceSession(str(work / "again.onnx"), options, providers=["CPUExecutionProvider"])

        rows = [
            ("mindspore (the learner's compiled graph)", p50_us(lambda: ms_engine.act(obs, noise), calls), 0.0),
            ("onnxruntime, weights as inputs, run()", p50_us(lambda: lifted.run(None, feeds), calls),
             mean_ms(bound.push, 200)),
            ("onnxruntime, weights as inputs, I/O binding (the engine)", p50_us(lambda: bound.act(obs, noise), calls),
             mean_ms(bound.push, 200)),
            ("onnxruntime, initializers (session rebuilt per push)",
             p50_us(lambda: plain.run(None, {"obs": obs, "noise": noise}), calls), mean_ms(rebuild, 20)),
            ("onnxruntime, re-exported per push", p50_us(lambda: plain.run(None, {"obs": obs, "noise": noise}), calls),
             mean_ms(reexport, 3)),
        ]  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return [(name, us, ms) for name, us, ms in rows] + [("", float(cfg.num_steps), float(cfg.num_envs))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--envs", default="CartPole-v1,Pendulum-v1")
    p.add_argument("--calls", type=int, default=5000)
    args = p.parse_args()
    print(measured_here(f"python bench/rollout_engine.py {' '.join(sys.argv[1:])}") + "\n")
    print("| env | way | act p50 (µs) | vs mindspore | push (ms) | acting + push per iteration (ms) |")
    print("|---|---|---:|---:|---:|---:|")
    for env_id in args.envs.split(","):
        rows = measure(env_id, args.calls)
        num_steps = rows[-1][1]
        base = rows[0][1]
        for name, us, push in rows[:-1]:
            per_iteration = num_steps * us / 1e3 + (push or 0.0)
            print(f"| {env_id} | {name} | {us:.1f} | {us / base:.2f}x | {push:.3f} | {per_iteration:.1f} |",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
