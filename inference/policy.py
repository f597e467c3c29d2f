"""``inference.load(BUNDLE)``: a bundle's policy for a team's own control loop, without MindSpore.

    policy = inference.load("bundles/cartpole")            # Lite in this process when it can run here
    action = policy.act(obs)                                 # one observation → one env action
    actions = policy.act(batch)                              # [n, *obs] → n actions

The policy acts as the bundle's contract says: the graph's own action output (post-processing inside the graph),
or argmax / squash of its scores; ``mode="stochastic"`` feeds the sampling graph seeded noise (``seed=``) or takes
``noise=``. A policy that carries state keeps it between calls, one row per observation row, from the contract's
``init`` (``reset()`` starts new episodes, and a call with another number of rows needs it first: a ``FeedError``
otherwise; ``state=`` overrides the state for one call).

``record=DIR`` keeps every step for an audit against training (``inference.field``; ``policy.observe(reward,
done)`` adds the env's answers). At a fixed batch, the Lite path allocates nothing per call when the graph computes
the env action itself: the returned array is Lite's output buffer, overwritten by the next call (copy it to keep).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle import Bundle, load_bundle
from inference.errors import UsageError
from inference.field import DEFAULT_CHUNK_STEPS, Recorder
from inference.lite_client import LiteRunner
from inference.lite_common import RunnerUnavailable
from inference.sdk import has_file
from inference.tensors import FeedError

RUNTIMES = ("best", "lite", "lite-isolated", "onnxruntime")


class OnnxModel:
    """ONNX Runtime on one graph, with the interface of ``LiteModel`` that ``Policy`` and ``inference.bench``
    use (``infer`` and ``infer_into`` alike: ONNX Runtime hands back fresh arrays)."""

    def __init__(self, path: Path, threads: int = 1) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.path, self.version = path, ort.__version__
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.names = [o.name for o in self.session.get_outputs()]

    def infer_into(self, *arrays: np.ndarray) -> dict[str, np.ndarray]:
        feed = dict(zip(self.inputs, arrays, strict=True))
        return dict(zip(self.names, self.session.run(self.names, feed), strict=True))

    infer = infer_into

    def close(self) -> None:
        self.session = None


def _open(bundle: Bundle, graph: str, runtime: str, **options: Any) -> tuple[Any, str]:
    """The model for ``graph`` and the runtime that serves it (``best``: Lite in this process, else ONNX Runtime,
    else the Lite runner process)."""
    from inference.lite_inprocess import LiteModel, in_process_reason

    if runtime in ("lite", "best") and in_process_reason() is None:
        return LiteModel(bundle.file(graph, "ms"), **options), "lite"
    if runtime == "onnxruntime" or (runtime == "best" and _has_onnxruntime() and has_file(bundle, graph, "onnx")):
        return OnnxModel(bundle.file(graph, "onnx"), options.get("threads", 1)), "onnxruntime"
    try:
        return _IsolatedModel(LiteRunner(bundle.file(graph, "ms"), **options)), "lite-isolated"
    except RunnerUnavailable as exc:
        why = in_process_reason() or "no library"
        raise UsageError(f"no runtime for {bundle.root}: Lite in this process ({why}), {exc}") from None


def _has_onnxruntime() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


class _IsolatedModel:
    """The runner process behind the ``infer_into`` interface (its answers are fresh arrays anyway)."""

    def __init__(self, runner: LiteRunner) -> None:
        self.runner = runner

    def infer_into(self, *arrays: np.ndarray) -> dict[str, np.ndarray]:
        return self.runner.infer(*arrays)

    def close(self) -> None:
        self.runner.close()


class Policy:
    """A bundle's acting graph on one runtime (see the module docstring)."""

    def __init__(
        self, bundle: Bundle, mode: str, runtime: str, seed: int, record: str | os.PathLike[str] | None = None,
        chunk_steps: int = DEFAULT_CHUNK_STEPS, **options: Any,
    ) -> None:  # fmt: skip
        if mode not in ("deterministic", "stochastic"):
            raise UsageError(f"mode must be deterministic or stochastic, got {mode!r}")
        if runtime not in RUNTIMES:
            raise UsageError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
        graph = bundle.mode_graph(mode)
        if graph is None:
            raise UsageError(f"bundle {bundle.root} has no {mode} graph")
        self.bundle, self.graph, self.mode = bundle, graph, mode
        self.contract = bundle.contract(graph)
        self.model, self.runtime = _open(bundle, graph, runtime, **options)
        self._rng = np.random.default_rng(seed)
        self._state: np.ndarray | None = None
        self.outputs: Mapping[str, np.ndarray] = {}  # the last call's graph outputs
        a = self.contract.action
        # The graph returns the env action itself: hand its buffer back without any host arithmetic.
        self._direct = a.action if a.action is not None and (a.kind != "deterministic" or a.discrete) else None
        self.recorder = None if record is None else Recorder(record, bundle, graph, self.runtime, chunk_steps)

    def reset(self) -> None:
        """Start new episodes: the carried state goes back to the contract's ``init`` at the next call."""
        self._state = None
        if self.recorder is not None:
            self.recorder.new_episode()

    def observe(self, reward: Any, done: Any = False) -> None:
        """The env's answer to the last action(s), for the recording (rewards give the field's episode returns)."""
        if self.recorder is not None:
            self.recorder.observe(reward, done)

    def act(self, obs: Any, noise: np.ndarray | None = None, state: np.ndarray | None = None) -> np.ndarray:
        """The env action(s) for one observation or a batch of them (see the module docstring)."""
        c = self.contract
        single = _single(c, obs)
        rows = c.batch_observations([obs]) if single else obs if c.obs_dict else np.asarray(obs, c.obs_dtype)
        n = len(rows)
        feeds = c.obs_inputs(rows)
        host_noise = None
        if self.mode == "stochastic":
            noise = self.bundle.sample_noise(self.graph, self._rng, n) if noise is None else np.asarray(noise)
            if c.takes_noise:
                feeds.append(np.asarray(noise, np.float32))
            else:
                host_noise = noise
        if c.states:
            if state is not None:
                self._state = state
            elif self._state is None:
                self._state = c.initial_state(n)
            elif len(self._state) != n:  # a silent re-init would restart every episode's memory mid-way
                raise FeedError(f"the carried state holds {len(self._state)} row(s) and this call has {n} "
                                "observation(s): call reset() to start new episodes, or pass state=")  # fmt: skip
            feeds += c.state_inputs(self._state)
        self.outputs = self.model.infer_into(*feeds)
        if c.states:
            self._state = c.next_state(self.outputs)
        action = self.outputs[self._direct] if self._direct and host_noise is None else (
            c.env_action(self.outputs, host_noise=host_noise))  # fmt: skip
        if self.recorder is not None:
            self.recorder.record(feeds, self.outputs, action)
        return action[0] if single else action

    @property
    def state(self) -> np.ndarray | None:
        """The carried state the next call will feed (rows of a structured array; None without states)."""
        return self._state

    def close(self) -> None:
        self.model.close()
        if self.recorder is not None:
            self.recorder.close()

    def __enter__(self) -> Policy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _single(contract: Any, obs: Any) -> bool:
    """One observation (no batch dimension) rather than a batch of them."""
    if contract.obs_dict:
        return isinstance(obs, Mapping)
    return np.ndim(obs) == len(contract.obs_shape)


def load(
    bundle: str | os.PathLike[str] | Bundle,
    runtime: str = "best",
    mode: str = "deterministic",
    seed: int = 0,
    record: str | os.PathLike[str] | None = None,
    **options: Any,
) -> Policy:
    """A bundle's policy, ready to ``act``: ``runtime`` ``best`` (Lite in this process where it can run, else ONNX
    Runtime, else the Lite runner process), ``lite``, ``lite-isolated`` (the runner process: a watchdog for
    untrusted models) or ``onnxruntime``; ``record``: a directory that receives every step (``inference.field``;
    ``policy.observe(reward, done)`` adds the env's answers); ``options``: ``device``, ``device_id``, ``threads``,
    ``max_rows``, ``chunk_steps``."""
    b = bundle if isinstance(bundle, Bundle) else load_bundle(bundle)
    return Policy(b, mode, runtime, seed, record, **options)
