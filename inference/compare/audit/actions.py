"""An audit's judgement of the env actions: the one the device took (the recording's ``action`` column) against the
one the training path's outputs give under the contract (with the recorded noise for a stochastic step; a noise-input
graph fed zero noise by its deterministic action, as ``Policy`` acts). A discrete action may differ only where verify
lets a flip pass (the reference's score margin within what the tolerance lets the two scores move, the device's own
outputs giving that action, at most the preset's flip rate); a continuous one by the acting output's tolerance
(verify's ``action_atol``). An action that is not even what the device's own outputs give points at the host code
between the graph and the env.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from inference.bundle.contract import PolicyContract
from inference.bundle.recording import Chunk
from inference.compare.checks import Check
from inference.compare.judge.stats import Preset, Tolerance, score_allowance

EXAMPLES = 5  # differing steps listed


def _where(rows: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(rows.reshape(-1, *[1] * (a.ndim - 1)), a, b).astype(a.dtype, copy=False)


def _jsonable(x: Any) -> Any:
    a = np.asarray(x)
    return a.item() if a.ndim == 0 else a.tolist()


class Actions:
    """The recorded env actions against the training path's (see the module docstring)."""

    def __init__(self, contract: PolicyContract, preset: Preset) -> None:
        self.contract, self.preset = contract, preset
        self.steps = self.sampled = self.differ = self.explained = self.not_device = 0
        self.max_diff = 0.0
        self.atol = 0.0
        self.examples: list[dict[str, Any]] = []
        self.without_noise = False  # a host-sampled policy recorded without its noise: judged as deterministic

    def add(
        self, chunk: Chunk, ref: Mapping[str, np.ndarray], tolerance: Mapping[str, Tolerance], pooled: np.ndarray,
        graph_noise: np.ndarray | None, offset: int,
    ) -> np.ndarray:  # fmt: skip
        """One chunk; returns the steps whose action is not training's (beyond what the tolerance lets pass)."""
        c, a = self.contract, self.contract.action
        n = len(chunk)
        host = chunk.host_noise if c.samples_on_host else None
        sampled = np.zeros(n, bool) if host is None else np.isfinite(host).reshape(n, -1).all(1)
        self.without_noise |= c.samples_on_host and host is None
        still = self._deterministic_rows(graph_noise, n)
        want = self._env_action(ref, host, sampled, still)
        own = self._env_action(chunk.outputs, host, sampled, still)
        got = np.asarray(chunk.action)
        if a.is_discrete:
            w, g, o = (np.asarray(x).reshape(n, -1).astype(np.int64) for x in (want, got, own))
            differ = (w != g).any(1)
            follows = (o == g).all(1)
            near = self._near_ties(ref, w, g, tolerance, pooled, host, sampled, graph_noise)
            bad = differ & ~(near & follows)
            self.explained += int((differ & ~bad).sum())
        else:
            w, g, o = (np.asarray(x, np.float64).reshape(n, -1) for x in (want, got, own))
            tol = tolerance[a.action or a.distribution_output]
            finite = np.abs(w[np.isfinite(w)])
            atol = tol.atol + tol.scale * (float(finite.max()) if finite.size and tol.scale else 0.0)
            self.atol = max(self.atol, atol)
            diff = np.where(w == g, 0.0, np.abs(w - g))
            nan_differ = (np.isnan(w) != np.isnan(g)).any(1)
            bad = nan_differ | (np.nan_to_num(diff, nan=0.0) > atol).any(1)
            self.max_diff = max(self.max_diff, float(np.nan_to_num(diff, nan=0.0).max(initial=0.0)))
            follows = ((np.abs(o - g) <= 1e-6 * (1 + np.abs(o))) | (np.isnan(o) & np.isnan(g))).all(1)
            differ = bad
        self.steps += n
        self.sampled += int(sampled.sum())
        self.differ += int(bad.sum())
        self.not_device += int((bad & ~follows).sum())
        for row in np.flatnonzero(bad)[: max(0, EXAMPLES - len(self.examples))]:
            self.examples.append(
                {
                    "step": offset + int(row),
                    "recorded": _jsonable(got[row]),
                    "training": _jsonable(want[row]),
                    "device_outputs_give": _jsonable(own[row]),
                }
            )
        return bad

    def _deterministic_rows(self, graph_noise: np.ndarray | None, n: int) -> np.ndarray | None:
        """The steps a noise-input graph acted deterministically: fed ``contract.zero_noise`` (a drawn sample is never
        exactly that in every dimension)."""
        if graph_noise is None:
            return None
        fill = self.contract.zero_noise(1).reshape(-1)[0]
        rows = (np.asarray(graph_noise).reshape(n, -1) == fill).all(1)
        return rows if rows.any() else None

    def _env_action(
        self, outputs: Mapping[str, np.ndarray], host: np.ndarray | None, sampled: np.ndarray, still: np.ndarray | None,
    ) -> Any:  # fmt: skip
        """The env action of each step as the device's ``Policy`` takes it: drawn with the recorded host noise, the
        deterministic action of a noise-input graph fed zero noise, else the graph's own (``contract.mode_action``)."""
        c = self.contract
        action = np.asarray(c.env_action(outputs))
        if still is not None:
            action = _where(still, np.asarray(c.deterministic_action(outputs)), action)
        if host is not None and sampled.any():
            action = _where(sampled, np.asarray(c.env_action(outputs, host_noise=np.nan_to_num(host))), action)
        return action

    def _near_ties(
        self, ref: Mapping[str, np.ndarray], want: np.ndarray, got: np.ndarray, tolerance: Mapping[str, Tolerance],
        pooled: np.ndarray, host: np.ndarray | None, sampled: np.ndarray, graph_noise: np.ndarray | None,
    ) -> np.ndarray:  # fmt: skip
        """Per step: every head that differs does so at a near-tie of the reference's scores (``judge_flips``'s
        rule, with the noise of the step's sample in the scores)."""
        c, a = self.contract, self.contract.action
        ok = np.ones(len(want), bool)
        for h, head in enumerate(a.heads):
            rows = np.flatnonzero(want[:, h] != got[:, h])
            if not len(rows):
                continue
            scores = c.decision_scores(ref, graph_noise, h)
            if scores is None:
                ok[rows] = False
                continue
            scores = np.asarray(scores, np.float64)
            if host is not None and sampled.any():
                drawn = np.asarray(c.decision_scores(ref, np.nan_to_num(host), h), np.float64)
                scores = np.where(sampled[:, None], drawn, scores)
            tol = tolerance[head]
            values = np.asarray(ref[head], np.float64)
            atol = tol.row_atol(values, pooled)[rows]
            i, j = want[rows, h], got[rows, h]
            valid = (j >= 0) & (j < scores.shape[-1])
            j = np.clip(j, 0, scores.shape[-1] - 1)
            margins = scores[rows, i] - scores[rows, j]
            bound = score_allowance(tol, values[rows, i], values[rows, j], atol, a.probs is not None)
            ok[rows] = valid & (margins <= bound)
        return ok

    def facts(self) -> dict[str, Any]:
        return {"steps": self.steps, "sampled_steps": self.sampled, "differ": self.differ,
                "near_ties": self.explained, "not_from_device_outputs": self.not_device,
                "max_abs_diff": self.max_diff, "atol": self.atol, "examples": self.examples,
                "recorded_without_host_noise": self.without_noise}  # fmt: skip

    def check(self, runtime: str, observations: Check | None) -> Check:
        a = self.contract.action
        facts = self.facts()
        rate = self.explained / max(1, self.steps)
        noise = f" ({self.sampled} sampled with the recorded noise)" if self.sampled else ""
        if not self.differ and rate <= self.preset.max_flip_rate:
            text = f"all {self.steps} recorded env actions are what the training path's outputs give{noise}"
            if a.is_discrete and self.explained:
                text += f"; {self.explained} differ at near-ties within the tolerance of the scores"
            elif not a.is_discrete:
                text += f" (max |Δ| {self.max_diff:.2e}, tolerance {self.atol:.1e})"
            return Check(runtime, "field.actions", "pass", text, metrics=facts)
        first = self.examples[0] if self.examples else {}
        text = (f"{self.differ} of {self.steps} recorded env actions are not what the training path's outputs give"
                f"{noise}")  # fmt: skip
        if first:
            text += f" (first at step {first['step']}: recorded {first['recorded']}, training {first['training']})"
        if not self.differ:
            text = (f"{self.explained} of {self.steps} recorded env actions differ at near-ties: {rate:.2%}, more than "
                    f"the {self.preset.max_flip_rate:.2%} the tolerance allows")  # fmt: skip
        if self.without_noise:
            text += "; the recording holds no host noise, so its actions were judged as deterministic"
        if self.not_device:
            text += f"; {self.not_device} of them are not what the device's own outputs give either"
            diagnosis = {"stage": "post-processing", "detail": "the env actions the device took are not what its "
                         "graph's outputs give under the contract: the host code between the graph and the env "
                         "(action mapping, sampling, clipping) acted otherwise"}  # fmt: skip
        elif observations is not None and observations.diagnosis:
            diagnosis = dict(observations.diagnosis)
        else:
            diagnosis = {"stage": "runtime", "detail": "the device's outputs lead to other actions than training's "
                         "(see the observation check)"}  # fmt: skip
        return Check(runtime, "field.actions", "fail", text, metrics=facts, diagnosis=diagnosis)
