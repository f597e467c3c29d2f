"""Where a training run's time went: ``train --profile`` prints this table and writes ``profile.json``.

The Trainer always keeps these totals (a ``perf_counter`` pair per section, well under 1% of a step); the flag only
decides whether they are reported. Timing never touches the numbers a run computes, so a profiled run is
bitwise the run without ``--profile``.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from inference.machine.procfs import status_mb

PROFILE_JSON = "profile.json"
SCHEMA = "msrl-consistency/profile"
# Report order and what each section holds.
SECTIONS = {
    "setup": "building envs, Cells and the optimizer (after imports)",
    "compile": "the run's graphs (act, train step, evaluation policy), compiled when it starts, loaded from the "
    "compile cache, or reused from an earlier run in this process",
    "env stepping": "vector env steps, including EnvPool's resets of the envs that ended",
    "acting": "rollout act calls and critic values for bootstraps and GAE",
    "rollout bookkeeping": "noise sampling, buffer writes, reward scaling, episode counters",
    "mismatch correction": "the learner's log-probabilities of the rollout's actions and the importance weights "
    "(--rollout-engine onnxruntime)",
    "weight push": "the learner's Parameters copied into the engine that acts (--rollout-engine onnxruntime)",
    "GAE": "advantages and returns",
    "update": "PPO train-step calls (epochs x minibatches, several updates per call)",
    "normaliser statistics": "observation moments, their merge and the copy into the graph",
    "rank exchange": "the per-iteration exchange between data-parallel ranks (0 for one process)",
    "logging": "metrics.csv, episodes.csv and the progress bar",
    "checkpoints": "checkpoint, resume state and run.json writes, consistency checks",
    "evaluation": "periodic and final deterministic evaluations",
}


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class Profile:
    """Seconds and call counts per section."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds = dict.fromkeys(SECTIONS, 0.0)
        self.calls = dict.fromkeys(SECTIONS, 0)
        # RSS at the run's milestones (``mark_rss``): what the imports, the graphs and the training itself hold; and
        # the private part of it (``RssAnon``), without file-backed pages. Most of those are MindSpore's libraries,
        # mapped from the page cache: clean, shared pages the kernel can drop, and more of them right after an
        # install, when every library file is still cached (measured 2026-12, ``import mindspore`` alone: 368 MB of
        # file-backed pages in a fresh venv, 250 MB in one installed hours before, the same 159 MB private in both).
        self.rss: dict[str, float | None] = {}
        self.private_rss: dict[str, float | None] = {}
        self.compiled: set[str] = set()  # graphs whose first (compiling) call is done

    def mark_rss(self, milestone: str) -> None:
        """Record the RSS now under ``milestone`` (its first time in this process)."""
        if milestone not in self.rss:
            self.rss[milestone] = status_mb("VmRSS")
            self.private_rss[milestone] = status_mb("RssAnon")

    def add(self, name: str, seconds: float, calls: int = 1) -> None:
        self.seconds[name] += seconds
        self.calls[name] += calls

    def rss_marks(self) -> dict[str, float | None]:
        return _rounded(self.rss)

    def private_rss_marks(self) -> dict[str, float | None]:
        return _rounded(self.private_rss)

    def graph_call(self, graph: str, section: str, seconds: float) -> None:
        """Book a compiled call under ``section``, or under ``compile`` if it was the graph's first call."""
        if graph in self.compiled:
            self.add(section, seconds)
        else:
            self.compiled.add(graph)
            self.add("compile", seconds)

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t0)

    def report(self, steps: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The content of profile.json: per section seconds, share of the wall time, calls and µs per call."""
        wall = time.perf_counter() - self.start
        accounted = sum(self.seconds.values())
        rows = {
            name: {"seconds": round(s, 4), "share": round(s / wall, 4) if wall else 0.0, "calls": self.calls[name],
                   "us_per_call": round(s / self.calls[name] * 1e6, 1) if self.calls[name] else None,
                   "what": SECTIONS[name]}
            for name, s in self.seconds.items()
        }  # fmt: skip
        rest = wall - accounted
        rows["other"] = {"seconds": round(rest, 4), "share": round(rest / wall, 4) if wall else 0.0, "calls": 0,
                         "us_per_call": None, "what": "everything not above (Python glue, waits)"}  # fmt: skip
        return {
            "schema": SCHEMA,
            "wall_seconds": round(wall, 3),
            "env_steps": steps,
            "steps_per_second": round(steps / wall, 1) if wall else None,
            "sections": rows,
            # Rollouts are synchronous (overlap measured slower on 2 cores: bench/overlap.py), so nothing is hidden.
            "overlap": {
                "env_seconds_hidden": 0.0,
                "env_seconds_total": round(self.seconds["env stepping"], 4),
                "fraction_of_env_time_hidden": 0.0,
            },
            "peak_rss_mb": round(peak_rss_mb(), 1),
            # MindSpore's import alone holds ~500 MB; a graph compiled (not loaded from the compile cache) keeps
            # ~100 MB more of heap than a loaded one. These marks show which part a run's peak came from.
            "rss_mb": self.rss_marks(),
            "private_rss_mb": self.private_rss_marks(),
            **(extra or {}),
        }


def write_report(run_dir: Path, report: dict[str, Any]) -> str:
    """Write profile.json into the run dir and return the table to print."""
    from inference.bundle.files import write_json_atomic

    write_json_atomic(run_dir / PROFILE_JSON, report)
    return format_table(report)


def format_table(report: dict[str, Any]) -> str:
    """The console table ``train --profile`` prints at the end of a run."""
    marks = _rss_marks(report.get("rss_mb", {}), report.get("private_rss_mb", {}))
    lines = [f"profile: {report['wall_seconds']:.1f} s wall, {report['env_steps']:,} env steps "
             f"({report['steps_per_second'] or 0:,.0f} steps/s), peak RSS {report['peak_rss_mb']:.0f} MB"
             f"{marks}, compile cache {report.get('compile_cache', 'off')}"
             f"{_pinned(report.get('cpu_pin'))}",
             f"  {'section':<22} {'seconds':>9} {'share':>7} {'calls':>9} {'µs/call':>10}"]  # fmt: skip
    for name, row in sorted(report["sections"].items(), key=lambda kv: -kv[1]["seconds"]):
        per_call = "" if row["us_per_call"] is None else f"{row['us_per_call']:,.1f}"
        lines.append(f"  {name:<22} {row['seconds']:>9.3f} {row['share']:>6.1%} {row['calls']:>9,} {per_call:>10}")
    ov = report["overlap"]
    lines.append(f"  overlap: {ov['env_seconds_hidden']:.3f} s of {ov['env_seconds_total']:.3f} s env stepping hidden "
                 f"behind acting ({ov['fraction_of_env_time_hidden']:.0%})")  # fmt: skip
    return "\n".join(lines)


def _rounded(marks: dict[str, float | None]) -> dict[str, float | None]:
    return {name: None if mb is None else round(mb, 1) for name, mb in marks.items()}


def _rss_marks(marks: dict[str, float | None], private: dict[str, float | None]) -> str:
    """`` (after setup 572 of which private 171, ...)`` for the console line; empty without procfs."""
    known = [f"{name} {mb:.0f}" + (f" of which private {private[name]:.0f}" if private.get(name) is not None else "")
             for name, mb in marks.items() if mb is not None]  # fmt: skip
    return f" ({', '.join(known)})" if known else ""


def _pinned(pin: dict[str, Any] | None) -> str:
    return f", threads on CPU {pin['cpu']}" if pin and pin.get("cpu") is not None else ""
