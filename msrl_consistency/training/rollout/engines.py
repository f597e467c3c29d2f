"""What a rollout acts through: the learner's own compiled graph, or the policy's exported graph in ONNX Runtime.

``mindspore`` acts through ``RolloutPolicy`` compiled in GRAPH_MODE: a fixed cost per call (a few hundred µs on the
CPU backend) whatever the batch. ``onnxruntime`` acts through the same Cell exported to ONNX as ``export`` writes it
(``artifacts.graphs.write_onnx``), at a few tens of µs per call: the rollouts are taken by a graph of the kind the
device runs. Every Parameter the graph reads becomes one of its inputs, bound once to a buffer of this process
(ONNX Runtime's I/O binding reads it in place); after each update ``push`` copies the learner's Parameters into
those buffers, bit for bit, so the engine needs neither a new export nor a new session.

The two engines compute the same policy up to float rounding. What that mismatch does to the update is measured and
corrected, as the large RL frameworks do for their inference engines (decoupled PPO with truncated importance
weights, verl's rollout correction): the engine's log-probabilities are the behaviour policy's; the learner computes
its own on the same rows (``LearnerLogProb``), the PPO ratio is taken against those, and each row's policy term is
weighted by ``min(π_learner / π_engine, IS_THRESHOLD)``. ``mismatch`` gives the per-iteration metrics.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from mindspore import Tensor, nn

from inference.bundle.files import write_bytes_atomic
from inference.errors import UsageError
from msrl_consistency import compat
from msrl_consistency.agent import PolicySpec, RolloutPolicy
from msrl_consistency.agent import distributions as D
from msrl_consistency.training.profile import Profile

IS_THRESHOLD = 2.0  # truncation of the importance weights (verl's default rollout_is_threshold)
# Health ranges as verl's rollout-correction metrics are read: an effective sample size below 0.5 of the rows or a KL
# above 0.1 means the engine acts as another policy, not as the learner's up to rounding.
MIN_ESS, MAX_K3_KL = 0.5, 0.1
EXPORTS = "rollout-onnx"  # the exported rollout graphs, under the compile cache's root
MISMATCH_FIELDS = ["rollout_is_mean", "rollout_is_max", "rollout_ess", "rollout_k3_kl", "rollout_max_abs_dlogp"]


def resolve(requested: str, lower: str, device: str) -> tuple[str, str]:
    """The engine a run acts with, and why (``TrainConfig.validate`` has refused what cannot run): ``auto`` takes
    ONNX Runtime where it computes the actor as the learner does (fp32, on the CPU)."""
    if requested != "auto":
        return requested, f"asked for (--rollout-engine {requested})"
    if lower != "fp32":
        return "mindspore", f"auto: the actor computes in {lower} (--lower), so its rollouts run its own Cell"
    if device.lower() != "cpu":
        return "mindspore", f"auto: ONNX Runtime acts on the CPU; the learner runs on {device}"
    return "onnxruntime", "auto: the faster here (a MindSpore act call costs a few hundred µs whatever the batch)"


class MindSporeEngine:
    """The learner's ``RolloutPolicy``, compiled: it reads the Parameters the update writes, so nothing is pushed."""

    name = "mindspore"
    corrects = False
    graphs = 1  # the MindSpore graphs its first act compiles

    def __init__(self, rollout_net: RolloutPolicy) -> None:
        self._call = compat.CompiledCall(rollout_net)  # hot path: skips Cell.__call__'s bookkeeping

    def act(self, obs: np.ndarray, noise: np.ndarray) -> np.ndarray:
        return self._call(Tensor(obs.astype(np.float32, copy=False)), Tensor(noise)).asnumpy()

    def push(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name}


class OnnxRuntimeEngine:
    """``RolloutPolicy`` exported to ONNX, run by ONNX Runtime with the learner's Parameters as bound inputs."""

    name = "onnxruntime"
    corrects = True
    graphs = 0  # its graph was exported as the run was set up

    def __init__(self, rollout_net: RolloutPolicy, spec: PolicySpec, batch: int, cache: Path | None = None) -> None:
        """``cache``: where the exported graph of this graph key is kept (``cached_export``), or None."""
        import onnxruntime as ort

        t0 = time.perf_counter()
        model, self.params, self.export = cached_export(rollout_net, spec, batch, cache)
        self.export_s = time.perf_counter() - t0
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        # buffers of their own: asnumpy() may hand back a view of the Parameter's memory, which the update rewrites
        self.weights = {name: np.array(p.asnumpy(), dtype=np.float32, order="C", copy=True) for name, p in self.params}
        self.obs = np.zeros((batch, spec.obs_dim), np.float32)
        self.noise = np.zeros((batch, spec.noise_dim), np.float32)
        self.out = np.zeros((batch, rollout_graph(spec).outputs[0].shape[1]), np.float32)
        self.binding = self.session.io_binding()
        for name, buf in (*self.weights.items(), ("obs", self.obs), ("noise", self.noise)):
            self.binding.bind_cpu_input(name, buf)  # read in place: a copy into the buffer is what the call sees
        output = self.session.get_outputs()[0].name
        self.binding.bind_output(output, "cpu", 0, np.float32, list(self.out.shape), self.out.ctypes.data)
        self.pushes, self.push_s = 0, 0.0

    def act(self, obs: np.ndarray, noise: np.ndarray) -> np.ndarray:
        if obs.shape != self.obs.shape:  # the graph was exported at the rollout's batch
            raise ValueError(f"the rollout engine acts on {self.obs.shape}, got observations {obs.shape}")
        np.copyto(self.obs, obs, casting="same_kind")
        np.copyto(self.noise, noise)
        self.session.run_with_iobinding(self.binding)
        return self.out.copy()

    def push(self) -> None:
        """The learner's Parameters into the bound buffers, bit for bit."""
        t0 = time.perf_counter()
        for name, param in self.params:
            np.copyto(self.weights[name], param.asnumpy())
        self.pushes += 1
        self.push_s += time.perf_counter() - t0

    def describe(self) -> dict[str, Any]:
        return {"engine": self.name, "export": self.export, "export_s": round(self.export_s, 3),
                "weights": len(self.params),
                "pushes": self.pushes, "push_ms_mean": round(1e3 * self.push_s / max(1, self.pushes), 4)}  # fmt: skip


_exports: dict[Path, bytes] = {}  # this process's exports by cache file (a seed sweep in one process)


def cached_export(
    rollout_net: RolloutPolicy, spec: PolicySpec, batch: int, cache: Path | None
) -> tuple[Any, list, str]:
    """``_exported``, kept in ``cache`` (a file named by the run's graph key: the config, the policy spec, MindSpore's
    version and this package's sources, so a graph is only reused where it would be exported the same), and in this
    process; and whether it was exported, loaded or taken from this process. The weights are graph inputs, so the
    graph holds no run's values. A cached file whose inputs are not the Parameters' is exported again."""
    import onnx

    names = dict(rollout_net.parameters_and_names())
    candidates = [("this process", _exports.get(cache))] if cache is not None else []
    if cache is not None and cache.is_file():
        with contextlib.suppress(OSError):
            candidates.append(("loaded", cache.read_bytes()))
    for how, data in candidates:
        if data is None:
            continue
        with contextlib.suppress(Exception):  # a damaged file is exported again
            model = onnx.load_from_string(data)
            lifted = [i.name for i in model.graph.input if i.name in names]
            if lifted and {i.name for i in model.graph.input} == {"obs", "noise", *lifted}:
                _exports[cache] = data
                return model, [(n, names[n]) for n in lifted], how
    model, params = _exported(rollout_net, spec, batch)
    if cache is not None:
        data = model.SerializeToString()
        _exports[cache] = data
        with contextlib.suppress(OSError):  # a cache that cannot be written costs the next run an export
            cache.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_bytes_atomic(cache, data)
    return model, params, "exported"


def rollout_graph(spec: PolicySpec) -> Any:
    """``RolloutPolicy``'s inputs and its one packed output (``agent.policy.unpack_rollout``), as export names them."""
    from inference.bundle.contract import TensorMeta
    from msrl_consistency.artifacts.graphs import GraphIO

    f32 = np.dtype("float32")
    width = 2 * (1 if spec.discrete else spec.action_dim) + 2
    inputs = (TensorMeta("obs", f32, (-1, spec.obs_dim)), TensorMeta("noise", f32, (-1, spec.noise_dim)))
    return GraphIO("rollout", "stochastic", inputs, (TensorMeta("packed", f32, (-1, width)),))


def _exported(rollout_net: RolloutPolicy, spec: PolicySpec, batch: int) -> tuple[Any, list[tuple[str, Any]]]:
    """The ONNX model of ``rollout_net`` with every Parameter it reads lifted from an initializer to a graph input,
    and those Parameters by name. A Parameter the exporter folded into a constant could not be pushed: refused."""
    import onnx

    from msrl_consistency.artifacts.graphs import write_onnx

    graph = rollout_graph(spec)
    work = Path(tempfile.mkdtemp(prefix="msrl-rollout-"))
    try:  # a fresh wrapper of the same policy: MindSpore 2.10 fails exporting one Cell instance a second time (a run
        # that took over an earlier run's Cells in this process) with "i: 3 out of range"
        path = write_onnx(RolloutPolicy(rollout_net.policy), graph, work / "rollout.onnx", fixed_batch=batch)
        model = onnx.load(str(path))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    params = dict(rollout_net.parameters_and_names())
    read = {n for n, p in params.items() if p.requires_grad} | ({"policy.normalizer.mean", "policy.normalizer.var"}
                                                                 if spec.normalize_obs else set())  # fmt: skip
    lifted = [i for i in model.graph.initializer if i.name in params]
    missing = sorted(read - {i.name for i in lifted})
    if missing:
        raise UsageError(
            f"--rollout-engine onnxruntime: the exported graph folded {', '.join(missing)} into "
            "constants, so the learner's updates could not reach it; use --rollout-engine mindspore"
        )
    for init in lifted:
        model.graph.initializer.remove(init)
        model.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return model, [(i.name, params[i.name]) for i in lifted]


def make_engine(name: str, rollout_net: RolloutPolicy, spec: PolicySpec, batch: int, cache: Path | None = None) -> Any:
    if name == "onnxruntime":
        return OnnxRuntimeEngine(rollout_net, spec, batch, cache)
    return MindSporeEngine(rollout_net)


def export_cache(cfg: dict[str, Any], spec: dict[str, Any], world_size: int) -> Path | None:
    """Where the run's exported rollout graph is kept: next to the compile cache (``$MSRL_COMPILE_CACHE_DIR``), under
    the same rules (off with ``--compile-cache false``, never in a directory other users can write to)."""
    from msrl_consistency.training.compile_cache import default_root, graph_key, key_name, writable_by_others

    if not cfg.get("compile_cache", True):
        return None
    root = default_root()
    if writable_by_others(root) or writable_by_others(root / EXPORTS):
        return None
    return root / EXPORTS / f"{key_name(graph_key(cfg, spec, world_size))}.onnx"


class LearnerLogProb(nn.Cell):
    """The learner's log-probability of the actions a rollout took, on the rows it took them: the PPO ratio's
    denominator when another engine acted."""

    def __init__(self, policy: Any) -> None:
        super().__init__()
        self.policy = policy

    def construct(self, obs: Tensor, actions: Tensor) -> Tensor:
        param = self.policy.dist_param(obs)
        if self.policy.discrete:
            return D.categorical_log_prob(param, self.policy.prepare_actions(actions))
        return D.gaussian_log_prob(param, self.policy.log_std + 0.0 * param, actions)


class Correction:
    """The learner's log-probabilities of a rollout and the truncated importance weights they give."""

    def __init__(self, policy: Any, profile: Profile) -> None:
        self.call = compat.CompiledCall(LearnerLogProb(policy))
        self.profile = profile

    def compile(self, rows: int, spec: PolicySpec) -> int:
        act_shape = () if spec.discrete else (spec.action_dim,)
        self.call(Tensor(np.zeros((rows, spec.obs_dim), np.float32)), Tensor(np.zeros((rows, *act_shape), np.float32)))
        return 1

    def apply(self, buf: dict[str, np.ndarray]) -> dict[str, float]:
        """Replace ``buf["logp"]`` (the engine's, kept as ``behaviour_logp``) by the learner's, add ``is_weights``;
        the mismatch metrics."""
        t0 = time.perf_counter()
        obs, actions = buf["obs"], buf["actions"]
        rows = obs.shape[0] * obs.shape[1]
        flat = (obs.reshape(rows, -1), actions.reshape(rows, *actions.shape[2:]))
        learner = self.call(Tensor(flat[0]), Tensor(flat[1])).asnumpy().reshape(buf["logp"].shape)
        self.profile.graph_call("learner_logp", "mismatch correction", time.perf_counter() - t0)
        buf["behaviour_logp"], buf["logp"] = buf["logp"], learner
        weights, metrics = mismatch(learner, buf["behaviour_logp"])
        buf["is_weights"] = weights
        return metrics


def mismatch(learner_logp: np.ndarray, behaviour_logp: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
    """Truncated importance weights ``min(π_learner / π_engine, IS_THRESHOLD)`` and the mismatch metrics: their mean
    and maximum, the effective sample size (as a share of the rows), the k3 estimate of KL(engine ‖ learner) and the
    largest |Δ log π|."""
    delta = (learner_logp.astype(np.float64) - behaviour_logp.astype(np.float64)).ravel()
    ratio = np.exp(delta)
    weights = np.minimum(ratio, IS_THRESHOLD)
    ess = float(weights.sum() ** 2 / max(len(weights) * float((weights**2).sum()), 1e-300))
    metrics = {
        "rollout_is_mean": float(weights.mean()),
        "rollout_is_max": float(weights.max()),
        "rollout_ess": ess,
        "rollout_k3_kl": float(np.mean(ratio - 1.0 - delta)),
        "rollout_max_abs_dlogp": float(np.abs(delta).max()),
    }
    return weights.astype(np.float32).reshape(learner_logp.shape), metrics


def keep_worst(worst: dict[str, float], metrics: dict[str, float]) -> None:
    """Fold one rollout's ``metrics`` into ``worst``: per metric the value furthest from an engine acting as the
    learner (the smallest effective sample size, the IS mean furthest from 1, the largest of the rest)."""

    def badness(key: str, value: float) -> float:
        return {"rollout_ess": -value, "rollout_is_mean": abs(value - 1.0)}.get(key, value)

    for key, value in metrics.items():
        if key not in worst or badness(key, value) > badness(key, worst[key]):
            worst[key] = value


def unhealthy(metrics: dict[str, float]) -> str | None:
    """What in the metrics says the engine acts as another policy (``MIN_ESS``, ``MAX_K3_KL``); None when healthy."""
    bad = []
    if metrics["rollout_ess"] < MIN_ESS:
        bad.append(f"effective sample size {metrics['rollout_ess']:.3f} < {MIN_ESS}")
    if metrics["rollout_k3_kl"] > MAX_K3_KL:
        bad.append(f"KL {metrics['rollout_k3_kl']:.3g} > {MAX_K3_KL}")
    return "; ".join(bad) or None
