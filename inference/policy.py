"""``inference.load(BUNDLE)``: a bundle's policy for a team's own control loop, without MindSpore.

    with inference.load("bundles/cartpole", record="field/run-1") as policy:
        obs, _ = env.reset(seed=0)
        while True:
            action = policy.act(obs)                 # one observation → one env action (yours to keep)
            obs, reward, terminated, truncated, _ = env.step(action)
            policy.observe(reward, terminated or truncated)
            ...

``Policy`` is the deploy side's one path from an observation to an env action: ``play`` and ``bench`` act through
it. It acts as the bundle's contract says: the graph's own action output (post-processing inside the graph), or
argmax / squash of its scores; ``mode="stochastic"`` feeds the sampling graph seeded noise (``seed=``) or takes
``noise=``, and a graph that takes noise acts deterministically on zero noise (the squashed mean, the scores'
argmax). A policy that carries state keeps it between calls, one row per observation row, from the contract's
``init`` (``reset()`` starts new episodes; a call with another number of rows needs it first; ``state=`` overrides
the state for one call).

What ``act`` accepts is checked, never cast (``bundle/act_inputs.py``): the contract's dtypes, one observation or a
batch, a ``Dict`` observation as a dict (Gymnasium's vector layout for a batch). What it returns is the caller's to
keep; ``act_view`` is the allocation-free variant for a single-threaded loop. One call runs at a time, so threads
may share a policy. ``runtime="best"`` tries Lite in this process, then ONNX Runtime, then the Lite runner process
(``inference.runtimes.serving``); ``policy.runtime`` and ``policy.runtime_reason`` say which serves and why.

``record=DIR`` keeps every step for an audit against training (``inference.field``; ``observe(reward, done)`` adds
the env's answers, one per row).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle import MODES, Bundle, load_bundle
from inference.bundle.act_inputs import float32_input, observation_inputs
from inference.bundle.tensors import FeedError
from inference.errors import UsageError
from inference.field import DEFAULT_CHUNK_STEPS, Recorder
from inference.runtimes.serving import RUNTIMES, OnnxModel, open_graph  # noqa: F401 - OnnxModel: part of this API

LAYOUTS_KEPT = 16  # observation array layouts whose check is kept (a caller alternates a few batch sizes at most)


class Policy:
    """A bundle's acting graph on one runtime (see the module docstring)."""

    def __init__(
        self, bundle: Bundle, mode: str = "deterministic", runtime: str = "best", seed: int = 0,
        record: str | os.PathLike[str] | None = None, chunk_steps: int = DEFAULT_CHUNK_STEPS, fmt: str = "auto",
        **options: Any,
    ) -> None:  # fmt: skip
        if mode not in MODES:
            raise UsageError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if runtime not in RUNTIMES:
            raise UsageError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
        graph = bundle.mode_graph(mode)
        if graph is None:
            kind = bundle.contract(bundle.graphs[0]).action.kind
            why = "it takes no noise" if mode == "stochastic" else "its noise-input graph has no noise-free decision"
            raise UsageError(f"bundle {bundle.root} has no {mode} mode: a {kind} policy whose {why}")
        self.bundle, self.graph, self.mode = bundle, graph, mode
        self.contract = bundle.contract(graph)
        served = open_graph(bundle, graph, runtime, fmt, **options)
        self.model, self.runtime, self.file, self.runtime_reason = served.model, served.runtime, served.file, served.why
        self._lock = threading.Lock()  # one call at a time: the state, the noise stream, the model's buffers
        self._rng = np.random.default_rng(seed)
        self._state: np.ndarray | None = None
        self._closed = False
        a = self.contract.action
        # The graph returns the env action itself: its buffer is the answer, no host arithmetic.
        self._direct = a.action if a.action is not None and (a.kind != "deterministic" or a.discrete) else None
        c = self.contract
        one_array = not c.obs_dict and c.observations[0].discrete is None
        self._layouts: dict[tuple, bool] | None = {} if one_array else None  # array layouts accepted before
        # a call whose answer is the graph's own action output, with nothing else fed or recorded
        self._plain = one_array and mode == "deterministic" and not c.takes_noise and not c.states
        self._plain = self._plain and self._direct is not None and record is None
        self.recorder = None
        if record is not None:
            try:
                self.recorder = Recorder(record, bundle, graph, self.runtime, chunk_steps)
            except BaseException:
                self.model.close()
                raise

    # -- acting ---------------------------------------------------------------------------------------
    def act(self, obs: Any, noise: Any = None, state: np.ndarray | None = None) -> np.ndarray:
        """The env action(s) for one observation or a batch: an array the caller keeps (see the module docstring)."""
        with self._lock:
            single = self._short_path(obs, noise, state)
            if single is not None:  # the common control step, kept short: checked before at this layout
                action = self.model.infer_into(obs[None] if single else obs)[self._direct]
            else:
                action, _, single = self._checked_act(obs, noise, state)
            if not single:
                return action.copy()  # never a view of the runtime's buffers
            row = action[0]  # one row of a 1-D output is a NumPy scalar of its own; of more dimensions, a view
            return row.copy() if isinstance(row, np.ndarray) else row

    def act_view(self, obs: Any, noise: Any = None, state: np.ndarray | None = None) -> np.ndarray:
        """``act`` without the copy: where the graph computes the env action itself, the answer is a view of the
        runtime's output buffer, overwritten by this policy's next call. For a single-threaded control loop that uses
        each action before the next call; anything else: ``act``."""
        with self._lock:
            action, _, single = self._act(obs, noise, state)
        return action[0] if single else action

    def act_outputs(
        self, obs: Any, noise: Any = None, state: np.ndarray | None = None
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The env action(s) and every graph output of the call (copies), e.g. a value estimate next to the action."""
        with self._lock:
            action, outputs, single = self._act(obs, noise, state)
            action, outputs = np.array(action), {k: np.array(v) for k, v in outputs.items()}
        return (action[0] if single else action), outputs

    def _act(self, obs: Any, noise: Any, state: np.ndarray | None) -> tuple[np.ndarray, Mapping[str, np.ndarray], bool]:
        """One call, under the lock: the batch's actions and outputs (the runtime's own buffers, where it reuses
        them) and whether ``obs`` was a single observation."""
        single = self._short_path(obs, noise, state)
        if single is not None:
            outputs = self.model.infer_into(obs[None] if single else obs)
            return outputs[self._direct], outputs, single
        return self._checked_act(obs, noise, state)

    def _checked_act(
        self, obs: Any, noise: Any, state: np.ndarray | None
    ) -> tuple[np.ndarray, Mapping[str, np.ndarray], bool]:
        """``_act`` past its short path: every input checked against the contract."""
        if self._closed:
            raise UsageError("the policy is closed")
        c = self.contract
        obs_inputs, single = self._observation_inputs(obs)
        n = len(obs_inputs[0])
        host_noise = None
        if self.mode == "stochastic":
            noise = self._noise(noise, n)
            if not c.takes_noise:
                host_noise = noise
        elif noise is not None:
            raise FeedError("noise= is for mode='stochastic'; a deterministic policy takes none")
        feeds = [*obs_inputs, *c.noise_feed(self.mode, n, noise)]
        if c.states:
            feeds += c.state_inputs(self._state_for(state, n))
        outputs = self.model.infer_into(*feeds)
        if c.states:
            self._state = c.next_state(outputs)
        zero_noise = self.mode == "deterministic" and c.takes_noise  # acts on the decision, not the graph's sample
        if self._direct is not None and host_noise is None and not zero_noise:
            action = outputs[self._direct]
        else:
            action = c.mode_action(outputs, self.mode, host_noise)
        if self.recorder is not None:
            self.recorder.record(feeds, outputs, action, host_noise=host_noise)
        return action, outputs, single

    def _short_path(self, obs: Any, noise: Any, state: Any) -> bool | None:
        """Whether ``obs`` is a single observation, for a call that can skip every check: an array of a layout
        accepted before, nothing else fed, the answer the graph's own action output; None otherwise."""
        if self._plain and noise is None and state is None and type(obs) is np.ndarray and not self._closed:
            return self._layouts.get((obs.dtype, obs.shape, obs.strides))  # type: ignore[union-attr]
        return None

    def _observation_inputs(self, obs: Any) -> tuple[list[np.ndarray], bool]:
        """``observation_inputs``, its verdict kept per array layout: an array with the dtype, shape and strides of
        one accepted before is fed as it was then (a float array's values are never checked, so the layout decides
        everything); any other layout, a Discrete index or a Dict goes through every check."""
        if type(obs) is np.ndarray and self._layouts is not None:
            single = self._layouts.get((obs.dtype, obs.shape, obs.strides))
            if single is not None:
                return [obs[None]] if single else [obs], single
            inputs, single = observation_inputs(self.contract, obs)
            if len(self._layouts) >= LAYOUTS_KEPT:
                self._layouts.clear()
            self._layouts[(obs.dtype, obs.shape, obs.strides)] = single
            return inputs, single
        return observation_inputs(self.contract, obs)

    def _noise(self, noise: Any, n: int) -> np.ndarray:
        """This call's sampling noise: the caller's (float32, one row per observation) or the seeded stream's."""
        width = self.bundle.noise_dim(self.graph)
        shape = tuple(self.contract.noise_shape) if self.contract.takes_noise else (width,)
        if noise is None:
            return self.bundle.sample_noise(self.graph, self._rng, n).reshape(n, *shape)
        return float32_input(noise, shape, n, "noise")

    def _state_for(self, state: np.ndarray | None, n: int) -> np.ndarray:
        """The carried state this call feeds: ``state=``, the previous call's, or the contract's init."""
        c = self.contract
        if state is not None:
            want = self._state_dtype()
            if not isinstance(state, np.ndarray) or state.dtype != want or state.shape != (n,):
                got = f"{getattr(state, 'dtype', type(state).__name__)} {getattr(state, 'shape', '')}".strip()
                raise FeedError(f"state= must be {n} row(s) of {want} (policy.state's layout), got {got}")
            self._state = state
        elif self._state is None:
            self._state = c.initial_state(n)
        elif len(self._state) != n:  # a silent re-init would restart every episode's memory mid-way
            raise FeedError(f"the carried state holds {len(self._state)} row(s) and this call has {n} "
                            "observation(s): call reset() to start new episodes, or pass state=")  # fmt: skip
        assert self._state is not None
        return self._state

    def _state_dtype(self) -> np.dtype:
        from inference.bundle.contract import state_dtype

        return state_dtype(self.contract.states)

    # -- episodes and recording -------------------------------------------------------------------------
    def reset(self) -> None:
        """Start new episodes: the carried state goes back to the contract's ``init`` at the next call."""
        with self._lock:
            self._state = None
            if self.recorder is not None:
                self.recorder.new_episode()

    def observe(self, reward: Any, done: Any = False) -> None:
        """The env's answer to the last action(s), one per row: for the recording (episode returns and boundaries;
        a row whose ``done`` is true starts a new episode at its next step)."""
        with self._lock:
            if self.recorder is not None:
                self.recorder.observe(reward, done)

    @property
    def state(self) -> np.ndarray | None:
        """The carried state the next call will feed (rows of a structured array; None without states)."""
        return self._state

    def close(self) -> None:
        """Release the runtime and finish the recording (idempotent); a recording that failed raises here."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self.model.close()
            finally:
                if self.recorder is not None:
                    self.recorder.close()

    def __enter__(self) -> Policy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Policy({self.bundle.root}, {self.graph}, {self.mode}, {self.runtime}: {self.runtime_reason})"


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
    untrusted models) or ``onnxruntime``; ``record``: a directory that receives every step (``inference.field``);
    ``options``: ``fmt`` (``auto``, ``ms``, ``mindir``: the Lite file), ``device``, ``device_id``, ``threads``,
    ``max_rows``, ``timeout`` (the runner's watchdog), ``chunk_steps``."""
    b = bundle if isinstance(bundle, Bundle) else load_bundle(Path(bundle))
    return Policy(b, mode, runtime, seed, record, **options)
