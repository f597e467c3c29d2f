"""Deterministic evaluation (argmax / mean action) of the policy being trained, shared out over ranks.

It touches no training RNG stream or env, so evaluating during a run leaves its training bitwise unchanged; and
it plays the policy export and verify compute (``DeterministicPolicy``), never graph-kernel fused.
"""

from __future__ import annotations

import time

import numpy as np
from mindspore import Tensor

from msrl_consistency import compat
from msrl_consistency.agent import DeterministicPolicy, PolicySpec
from msrl_consistency.envs import make_env
from msrl_consistency.training import distributed as dist
from msrl_consistency.training.profile import Profile
from msrl_consistency.training.seeds import eval_seed

# Rows of an evaluation act call: episodes evaluated in lockstep (a MindSpore call's cost is flat in the batch).
EVAL_BATCH = 16


class Evaluator:
    """Evaluation episodes of one run: episode k resets with ``seed + 10000 + k`` on whichever rank plays it."""

    def __init__(
        self, env_id: str, seed: int, spec: PolicySpec, policy: DeterministicPolicy, comm: dist.Comm, profile: Profile
    ) -> None:
        self.env_id, self.seed, self.spec, self.policy = env_id, seed, spec, policy
        self.comm, self.profile = comm, profile
        self._deterministic: compat.CompiledCall | None = None  # compiled once, on the first evaluation

    @property
    def compiled(self) -> bool:
        return self._deterministic is not None

    def compile(self) -> int:
        """Compile the evaluation policy on dummy observations (it holds no state, draws no noise); how many."""
        self._deterministic = compat.CompiledCall(self.policy)
        with compat.gc_frozen():
            self._deterministic(Tensor(np.zeros((EVAL_BATCH, self.spec.obs_dim), np.float32)))
        return 1

    def evaluate(self, episodes: int) -> list[float]:
        """Every rank's returns of ``episodes`` episodes, in episode order.

        Rank r plays episodes k = r, r + W, ..., up to ``EVAL_BATCH`` of them at a time in lockstep.
        """
        if self._deterministic is None:
            t0 = time.perf_counter()
            self.compile()
            self.profile.add("compile", time.perf_counter() - t0)
        with self.profile.section("evaluation"):
            ks = list(range(self.comm.rank, episodes, self.comm.world_size))
            mine: dict[int, float] = {}
            for start in range(0, len(ks), EVAL_BATCH):
                chunk = ks[start : start + EVAL_BATCH]
                mine.update(zip(chunk, self._episodes(chunk), strict=True))
            merged: dict[int, float] = {}
            for part in self.comm.gather(mine):
                merged.update(part)
        return [merged[k] for k in range(episodes)]

    def timed(self, episodes: int) -> tuple[list[float], float, float]:
        """``evaluate`` with its wall and CPU seconds (benchmarks take both out of the training's figures)."""
        start, cpu_start = time.perf_counter(), time.process_time()
        returns = self.evaluate(episodes)
        return returns, time.perf_counter() - start, time.process_time() - cpu_start

    def _episodes(self, ks: list[int]) -> list[float]:
        """Episodes ``ks`` (at most ``EVAL_BATCH``), each in its own env, with one act call per step for all of them.

        Every call has ``EVAL_BATCH`` rows; a finished episode's row (and an unused one) holds a stale observation
        whose action is dropped. The batch is fixed because MindSpore's CPU matmul rounds a row's last bits
        differently for different batch sizes (a row does not depend on the other rows), so an episode's return
        does not depend on how many episodes, or ranks, evaluate.
        """
        assert self._deterministic is not None
        envs = [make_env(self.env_id) for _ in ks]
        obs = np.zeros((EVAL_BATCH, self.spec.obs_dim), np.float32)
        for i, (env, k) in enumerate(zip(envs, ks, strict=True)):
            obs[i] = env.reset(seed=eval_seed(self.seed, k))[0]
        totals, live = [0.0] * len(ks), [True] * len(ks)
        while any(live):
            actions = self._deterministic(Tensor(obs))[0].asnumpy()
            for i, env in enumerate(envs):
                if live[i]:
                    obs[i], reward, terminated, truncated, _ = env.step(
                        int(actions[i]) if self.spec.discrete else actions[i]
                    )
                    totals[i] += float(reward)
                    live[i] = not (terminated or truncated)
        for env in envs:
            env.close()
        return totals
