"""What an audit judges beyond verify's comparison, accumulated chunk by chunk in memory bounded by a chunk (the
env actions: ``audit_actions``).

* ``NonFinite``: steps whose observation holds NaN or inf, per dimension, and what the device did there: its
  outputs compared with the training path's as verify compares them (NaN only where the reference has NaN, the rest
  within tolerance) and the actions it took.
* ``Windows``: the decision output's error per time window, relative to the tolerance granted
  (``Tolerance.allowance``: above 1 means beyond tolerance). Every window is judged and the worst named: a window
  beyond tolerance fails (the device answered otherwise than training in that period; the observation check fails
  on the same steps, this check says when); a window whose error is ``DRIFT_RISE`` times the median window's and at
  least ``DRIFT_NOTICE`` of the tolerance is a warning (the error grows with uptime, not yet beyond tolerance).
* ``Ranges``: the observations against training's normaliser statistics; ``Returns``: the recorded episodes'
  returns (an episode per id and env row; an episode not ended in the recording is counted, not scored).
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inference.bundle import Bundle
from inference.bundle.contract import PolicyContract
from inference.bundle.recording import Chunk
from inference.compare.checks import Check
from inference.compare.judge.stats import Tolerance, compare_arrays

OOD_SIGMA = 4.0  # an observation dimension this many training standard deviations from the mean is out of range
OOD_WARN_SHARE = 0.01  # more steps than this out of range (or any clipped by the normaliser) is reported
DRIFT_RISE = 10.0
DRIFT_NOTICE = 0.1


class NonFinite:
    """Steps with NaN or inf observations, and what the device did there (see the module docstring)."""

    def __init__(self, contract: PolicyContract, outputs: Sequence[str]) -> None:
        self.contract = contract
        self.fields = [f for f in contract.observations if np.dtype(f.dtype).kind == "f"]
        self.nan_dims = {f.name: np.zeros(int(np.prod(f.shape)), np.int64) for f in self.fields}
        self.inf_dims = {f.name: np.zeros(int(np.prod(f.shape)), np.int64) for f in self.fields}
        self.steps = self.nan_steps = self.inf_steps = self.device_nan = self.training_nan = self.action_differ = 0
        self.first: int | None = None
        self.outputs = {k: {"count": 0, "mismatches": 0, "nan_mismatches": 0, "max_abs": 0.0} for k in outputs}
        self.taken: dict[str, int] = {}  # discrete: action -> steps
        self.low: np.ndarray | None = None  # continuous: the range of the actions taken
        self.high: np.ndarray | None = None

    def add(
        self, chunk: Chunk, obs: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray],
        tolerance: Mapping[str, Tolerance], action_bad: np.ndarray, offset: int,
    ) -> np.ndarray:  # fmt: skip
        """One chunk; ``obs``: each float observation input by name. Returns the steps with NaN or inf."""
        n = len(chunk)
        nan, inf = np.zeros(n, bool), np.zeros(n, bool)
        for f in self.fields:
            x = np.asarray(obs[f.name]).reshape(n, -1)
            is_nan, is_inf = np.isnan(x), np.isinf(x)
            self.nan_dims[f.name] += is_nan.sum(0)
            self.inf_dims[f.name] += is_inf.sum(0)
            nan |= is_nan.any(1)
            inf |= is_inf.any(1)
        rows = nan | inf
        if not rows.any():
            return rows
        if self.first is None:
            self.first = offset + int(np.argmax(rows))
        self.steps += int(rows.sum())
        self.nan_steps += int(nan.sum())
        self.inf_steps += int((inf & ~nan).sum())
        self.action_differ += int(action_bad[rows].sum())
        device_nan, training_nan = np.zeros(n, bool), np.zeros(n, bool)
        for k, stats in self.outputs.items():
            want, got = np.asarray(ref[k]), np.asarray(chunk.outputs[k])
            if want.shape[:1] != (n,) or got.shape != want.shape:
                continue
            if want.dtype.kind == "f":
                training_nan |= np.isnan(want).reshape(n, -1).any(1)
                device_nan |= np.isnan(got).reshape(n, -1).any(1)
            cmp = compare_arrays(k, want[rows], got[rows], tolerance[k], np.zeros(int(rows.sum()), bool))
            stats["count"] += cmp.count
            stats["mismatches"] += cmp.mismatches
            stats["nan_mismatches"] += cmp.nan_mismatches
            stats["max_abs"] = max(stats["max_abs"], cmp.max_abs)
        self.device_nan += int(device_nan[rows].sum())
        self.training_nan += int(training_nan[rows].sum())
        taken = np.asarray(chunk.action)[rows]
        if self.contract.action.is_discrete:
            values, counts = np.unique(taken.reshape(len(taken), -1), axis=0, return_counts=True)
            for v, k in zip(values, counts, strict=True):
                key = str(v[0]) if len(v) == 1 else str(v.tolist())
                self.taken[key] = self.taken.get(key, 0) + int(k)
        else:
            flat = taken.reshape(len(taken), -1).astype(np.float64)
            lo, hi = np.nanmin(flat, 0, initial=np.inf), np.nanmax(flat, 0, initial=-np.inf)
            self.low = lo if self.low is None else np.minimum(self.low, lo)
            self.high = hi if self.high is None else np.maximum(self.high, hi)
        return rows

    def dimensions(self, counts: Mapping[str, np.ndarray], top: int = 10) -> list[dict[str, Any]]:
        named = [((f"{name}[{d}]" if self.contract.obs_dict else f"dimension {d}"), int(k))
                 for name, per in counts.items() for d, k in enumerate(per) if k]  # fmt: skip
        return [{"dimension": d, "steps": k} for d, k in sorted(named, key=lambda e: -e[1])[:top]]

    def facts(self, total: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "steps": self.steps, "share": self.steps / max(1, total), "nan_steps": self.nan_steps,
            "inf_steps": self.inf_steps, "first_step": self.first, "nan_dimensions": self.dimensions(self.nan_dims),
            "inf_dimensions": self.dimensions(self.inf_dims), "device_answered_nan": self.device_nan,
            "training_answered_nan": self.training_nan, "outputs": self.outputs,
            "actions_differing_from_training": self.action_differ,
        }  # fmt: skip
        if self.taken:
            out["actions_taken"] = dict(sorted(self.taken.items(), key=lambda e: -e[1])[:20])
        if self.low is not None and self.high is not None:
            out["actions_range"] = {"low": self.low.tolist(), "high": self.high.tolist()}
        return out

    def check(self, runtime: str, total: int) -> Check:
        facts = self.facts(total)
        if not self.steps:
            return Check(runtime, "field.nonfinite_observations", "pass",
                         f"no NaN or inf observation in {total} steps", metrics=facts)  # fmt: skip
        dims = ", ".join(f"{d['dimension']} ({d['steps']})" for d in (facts["nan_dimensions"] +
                                                                   facts["inf_dimensions"])[:4])  # fmt: skip
        differ = sorted(k for k, s in self.outputs.items() if s["mismatches"])
        did = (f"actions {facts['actions_taken']}" if "actions_taken" in facts else
               f"actions within {facts.get('actions_range')}")  # fmt: skip
        text = (
            f"{self.steps} of {total} steps ({facts['share']:.2%}) had NaN ({self.nan_steps}) or inf "
            f"({self.inf_steps}) observations, first at step {self.first}, in {dims}; the device acted on them "
            f"({did}; NaN outputs on {self.device_nan} of them, the training path's on {self.training_nan})"
        )
        if not differ:
            return Check(runtime, "field.nonfinite_observations", "warn", text + ": as the training path does there",
                         metrics=facts)  # fmt: skip
        detail = "; ".join(f"{k} {s['mismatches']}/{s['count']} ({s['nan_mismatches']} NaN where the training path "
                           "has none or the reverse)" for k, s in self.outputs.items() if s["mismatches"])  # fmt: skip
        diagnosis = {"stage": "runtime", "detail": "the device's runtime handles NaN/inf inputs otherwise than the "
                     "training path: its answers to invalid sensor input are not training's"}  # fmt: skip
        return Check(runtime, "field.nonfinite_observations", "fail", f"{text}; there the outputs differ: {detail}",
                     metrics=facts, diagnosis=diagnosis)  # fmt: skip


def decision_errors(
    want: np.ndarray, got: np.ndarray, tol: Tolerance, pooled: np.ndarray, compared: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per step: the decision output's largest absolute error, and its largest error relative to what the tolerance
    grants the element (``Tolerance.allowance``; above 1 fails, a NaN where the reference has none is infinite). Steps
    not ``compared`` count 0."""
    n = len(want)
    r, g = np.asarray(want, np.float64).reshape(n, -1), np.asarray(got, np.float64).reshape(n, -1)
    both = ~(np.isnan(r) | np.isnan(g))
    with np.errstate(invalid="ignore"):
        diff = np.where(both & (r != g), np.abs(r - g), 0.0)
    diff = np.nan_to_num(diff, nan=np.inf)
    allow = tol.allowance(r, tol.row_atol(want, pooled)[:, None])
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(both, diff / allow, np.where(np.isnan(r) != np.isnan(g), np.inf, 0.0))
    ratio = np.nan_to_num(ratio, nan=np.inf)
    return np.where(compared, diff.max(1, initial=0.0), 0.0), np.where(compared, ratio.max(1, initial=0.0), 0.0)


@dataclass
class Window:
    """One time window: its steps, the decision output's largest error there and relative to the tolerance, the steps
    beyond tolerance, the actions not training's, the steps with NaN/inf observations, the share out of range."""

    start_step: int
    end_step: int
    start_ns: int = 0
    end_ns: int = 0
    steps: int = 0
    max_abs: float = 0.0
    worst_ratio: float = 0.0
    mismatched_rows: int = 0
    action_mismatches: int = 0
    nonfinite_steps: int = 0
    ood_steps: int = 0

    @property
    def ood_share(self) -> float:
        return self.ood_steps / max(1, self.steps)

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "ood_share": self.ood_share}


class Windows:
    """Equal numbers of steps per window, in recording order (``count`` windows, at least 16 steps each)."""

    def __init__(self, total: int, count: int) -> None:
        k = max(1, min(count, total // 16 or 1))
        bounds = np.linspace(0, total, k + 1).astype(np.int64)
        self.windows = [Window(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
        self.last_ns: int | None = None
        self.clock_back = 0  # steps recorded at an earlier time than the step before them (a clock set back)

    def add(self, offset: int, time_ns: np.ndarray, rows: Mapping[str, np.ndarray]) -> None:
        """One chunk's per-step facts: ``abs``, ``ratio``, ``beyond``, ``action``, ``nonfinite``, ``ood``."""
        end = offset + len(time_ns)
        if len(time_ns):
            previous = time_ns[0] if self.last_ns is None else self.last_ns
            self.clock_back += int((np.diff(time_ns, prepend=previous) < 0).sum())
            self.last_ns = int(time_ns[-1])
        for w in self.windows:
            lo, hi = max(w.start_step, offset) - offset, min(w.end_step, end) - offset
            if hi <= lo:
                continue
            t = time_ns[lo:hi]
            w.start_ns = int(t.min()) if not w.steps else min(w.start_ns, int(t.min()))
            w.end_ns = max(w.end_ns, int(t.max()))
            w.steps += hi - lo
            w.max_abs = max(w.max_abs, float(rows["abs"][lo:hi].max()))
            w.worst_ratio = max(w.worst_ratio, float(rows["ratio"][lo:hi].max()))
            w.mismatched_rows += int(rows["beyond"][lo:hi].sum())
            w.action_mismatches += int(rows["action"][lo:hi].sum())
            w.nonfinite_steps += int(rows["nonfinite"][lo:hi].sum())
            w.ood_steps += int(rows["ood"][lo:hi].sum())

    def check(self, runtime: str) -> Check:
        w = [x for x in self.windows if x.steps]
        t0 = w[0].start_ns
        worst_at = max(range(len(w)), key=lambda i: w[i].worst_ratio)
        worst = w[worst_at]
        median = float(np.median([x.max_abs for x in w]))
        span = f"{len(w)} windows of ~{w[0].steps} steps" if len(w) > 1 else f"1 window of {w[0].steps} steps"
        seconds = (f"{(worst.start_ns - t0) / 1e9:.1f}-{(worst.end_ns - t0) / 1e9:.1f} s" if not self.clock_back
                   else "times not shown: the recorder's clock went back")  # fmt: skip
        named = f"window {worst_at + 1} (steps {worst.start_step}-{worst.end_step - 1}, {seconds})"
        metrics = {"windows": [x.to_dict() for x in w], "worst_window": worst_at, "median_max_abs": median,
                   "clock_went_back": self.clock_back}  # fmt: skip
        clock = (f"; the recorder's clock went back at {self.clock_back} step(s) (a clock set back): windows follow "
                 "the recorded order of the steps, not their times") if self.clock_back else ""  # fmt: skip
        beyond = [x for x in w if x.mismatched_rows or x.worst_ratio > 1]
        if beyond:
            text = (f"{span}: the decision output is beyond tolerance in {len(beyond)} of them; worst {named} at "
                    f"{worst.worst_ratio:.3g}x the tolerance (max abs {worst.max_abs:.2e}, {worst.mismatched_rows} "
                    "step(s) beyond)")  # fmt: skip
            return Check(runtime, "field.drift", "fail", text + clock, metrics=metrics)
        rises = worst.worst_ratio > DRIFT_NOTICE and worst.max_abs > DRIFT_RISE * max(median, 1e-12)
        if rises:
            text = (f"{span}: within tolerance, but the error rises in {named} to {worst.worst_ratio:.2f} of the "
                    f"tolerance, {worst.max_abs / max(median, 1e-12):.0f}x the median window's (max abs "
                    f"{worst.max_abs:.2e})")  # fmt: skip
            return Check(runtime, "field.drift", "warn", text + clock, metrics=metrics)
        text = (f"{span}: within tolerance in every window; worst {named} at {worst.worst_ratio:.2f} of the tolerance "
                f"(max abs {worst.max_abs:.2e}, median window {median:.2e})")  # fmt: skip
        return Check(runtime, "field.drift", "warn" if clock else "pass", text + clock, metrics=metrics)


class Ranges:
    """The field's observations against training's normaliser statistics (the manifest's)."""

    def __init__(self, bundle: Bundle, graph: str) -> None:
        norm = bundle.manifest.get("normalization") or {}
        self.why = ""
        if not norm.get("mean") or bundle.contract(graph).obs_dict:
            self.why = "the bundle records no observation statistics for this observation"
            return
        self.mean = np.asarray(norm["mean"], np.float64).ravel()
        self.std = np.sqrt(np.asarray(norm["var"], np.float64).ravel() + 1e-8)
        self.clip = float(norm.get("clip") or np.inf)
        d = self.mean.size
        self.sum_abs, self.max_abs, self.beyond = np.zeros(d), np.zeros(d), np.zeros(d, np.int64)
        self.steps = self.steps_beyond = self.steps_clipped = 0

    def add(self, obs: np.ndarray) -> np.ndarray:
        """One chunk's observations (an array observation); returns the steps out of range."""
        n = len(obs)
        if self.why:
            return np.zeros(n, bool)
        x = np.asarray(obs, np.float64).reshape(n, -1)
        if x.shape[1] != self.mean.size:
            self.why = f"the observation has {x.shape[1]} values, the statistics {self.mean.size}"
            return np.zeros(n, bool)
        finite = np.isfinite(x).all(1)
        z = np.abs((x[finite] - self.mean) / self.std)
        out = np.zeros(n, bool)
        out[finite] = (z > OOD_SIGMA).any(1)
        self.steps += len(z)
        self.sum_abs += z.sum(0)
        self.max_abs = np.maximum(self.max_abs, z.max(0, initial=0.0))
        self.beyond += (z > OOD_SIGMA).sum(0)
        self.steps_beyond += int(out.sum())
        self.steps_clipped += int((z > self.clip).any(1).sum())
        return out

    def facts(self) -> dict[str, Any]:
        if self.why:
            return {"available": False, "why": self.why}
        k = max(1, self.steps)
        return {"available": True, "sigma": OOD_SIGMA, "clip": self.clip, "steps": self.steps,
                "share_beyond_sigma": self.steps_beyond / k, "share_clipped": self.steps_clipped / k,
                "per_dimension": [{"dimension": d, "mean_abs_z": float(self.sum_abs[d] / k),
                                   "max_abs_z": float(self.max_abs[d]), "share_beyond_sigma": float(self.beyond[d] / k)}
                                  for d in range(self.mean.size)] if self.steps else []}  # fmt: skip

    def check(self, runtime: str) -> Check:
        ood = self.facts()
        if not ood["available"]:
            return Check(runtime, "field.out_of_distribution", "skip", ood["why"])
        share, clipped = ood["share_beyond_sigma"], ood["share_clipped"]
        worst = max(ood["per_dimension"], key=lambda d: d["max_abs_z"]) if ood["per_dimension"] else None
        status = "warn" if share > OOD_WARN_SHARE or clipped > 0 else "pass"
        text = (f"{share:.1%} of steps have a dimension beyond {OOD_SIGMA:g} training std, {clipped:.1%} clipped by "
                f"the normaliser (±{ood['clip']:g})")  # fmt: skip
        if worst is not None:
            text += f"; furthest: dimension {worst['dimension']} at {worst['max_abs_z']:.1f} std"
        if status == "warn":
            text += ": the device acts on states training did not cover"
        return Check(runtime, "field.out_of_distribution", status, text, metrics=ood)


@dataclass
class Returns:
    """Episode returns: an episode is one id on one env row of one recording; it ends at a step marked done."""

    open: dict[tuple[int, int], list[Any]] = field(default_factory=dict)  # (recording, env) -> [episode, sum, ok]
    episodes: array = field(default_factory=lambda: array("q"))
    envs: array = field(default_factory=lambda: array("q"))
    returns: array = field(default_factory=lambda: array("d"))
    unfinished: int = 0
    # ended episodes with a step whose reward is NaN or inf (or was never observed): kept and named, never averaged
    marked: list[dict[str, Any]] = field(default_factory=list)

    def add(self, recording: int, chunk: Chunk) -> None:
        width = int(chunk.env.max(initial=0)) + 1  # one int64 key per (episode, env row): np.unique on one column
        key = chunk.episode * width + chunk.env
        keys, inverse = np.unique(key, return_inverse=True)
        reward = np.asarray(chunk.reward, np.float64)
        sums = np.bincount(inverse, np.nan_to_num(reward, nan=0.0, posinf=0.0, neginf=0.0), len(keys))
        bad = np.bincount(inverse, ~np.isfinite(reward), len(keys)) > 0
        ended = np.bincount(inverse, chunk.done, len(keys)) > 0
        last = len(key) - 1 - np.unique(key[::-1], return_index=True)[1]  # each key's last step
        for k in np.argsort(last, kind="stable"):  # in time order
            episode, env = divmod(int(keys[k]), width)
            row = self.open.get((recording, env))
            if row is None or row[0] != episode:
                self.unfinished += row is not None
                row = self.open[(recording, env)] = [episode, 0.0, True]
            row[1] += float(sums[k])
            row[2] &= not bad[k]
            if ended[k]:
                del self.open[(recording, env)]
                if row[2]:
                    self.episodes.append(episode)
                    self.envs.append(env)
                    self.returns.append(row[1])
                else:
                    self.marked.append({"episode": episode, "env": env, "finite_sum": row[1]})

    def facts(self, training: Sequence[float], source: str = "", top: int = 5) -> dict[str, Any]:
        returns = np.frombuffer(self.returns, np.float64) if len(self.returns) else np.zeros(0)
        unfinished = self.unfinished + len(self.open)
        marked = {"non_finite": len(self.marked), "non_finite_episodes": self.marked[:top]} if self.marked else {}
        if not len(returns):
            return {"episodes": 0, "unfinished": unfinished, **marked,
                    "why": "no episode ended in the recording with its rewards recorded"}  # fmt: skip
        out: dict[str, Any] = {"episodes": len(returns), "unfinished": unfinished, "mean": float(returns.mean()),
                               "std": float(returns.std()), "max": float(returns.max()), "min": float(returns.min()),
                               **marked}  # fmt: skip
        if len(training):
            mean = float(np.mean(training))
            far = np.argsort(-np.abs(returns - mean), kind="stable")[:top]
            out |= {"training_mean": mean, "training_std": float(np.std(training)), "training_source": source,
                    "furthest": [{"episode": int(self.episodes[i]), "env": int(self.envs[i]),
                                  "return": float(returns[i]), "minus_training_mean": float(returns[i] - mean)}
                                 for i in far]}  # fmt: skip
        return out

    def check(self, runtime: str, facts: Mapping[str, Any]) -> Check | None:
        if facts.get("non_finite"):  # an env that answered NaN or inf, or steps never observed: said, never averaged
            first = facts["non_finite_episodes"][0]
            text = (f"{facts['non_finite']} ended episode(s) with a NaN or inf reward (or a step whose reward was "
                    f"never observed), not scored: first episode {first['episode']} env {first['env']} (finite "
                    f"rewards sum to {first['finite_sum']:.1f})")  # fmt: skip
            if facts.get("episodes"):
                text += (f"; the other {facts['episodes']} episodes: return {facts['mean']:.1f} ± {facts['std']:.1f}"
                         f" (range {facts['min']:.1f} to {facts['max']:.1f})")  # fmt: skip
            return Check(runtime, "field.returns", "warn", text, metrics=dict(facts))
        if not facts.get("episodes"):
            return None
        text = (f"{facts['episodes']} episodes, return {facts['mean']:.1f} ± {facts['std']:.1f} (range "
                f"{facts['min']:.1f} to {facts['max']:.1f})")  # fmt: skip
        if "training_mean" in facts:
            far = facts["furthest"][0]
            text += (f"; {facts['training_source']}: {facts['training_mean']:.1f} ± {facts['training_std']:.1f}; "
                     f"furthest: episode {far['episode']} env {far['env']} at {far['return']:.1f}")  # fmt: skip
        if facts["unfinished"]:
            text += f"; {facts['unfinished']} episode(s) not ended in the recording (or without rewards) not scored"
        return Check(runtime, "field.returns", "pass", text, metrics=dict(facts))
