"""Result types of a consistency check: every comparison is a ``Check``; a run is a ``VerifyResult``.

The report writers (``inference.report``) read these and nothing else, so the same reports come out
whether the reference was the training path or a golden file. The dependency runs one way, report on compare:
the console table lives here because a failing check prints it, ``inference.report.writers`` writes the files.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from inference.bundle import Bundle
from inference.errors import EXIT_INCONSISTENT, EXIT_OK, EXIT_RUNTIME_UNAVAILABLE

if TYPE_CHECKING:
    from inference.compare.judge.localize import Localization
    from inference.compare.options import VerifyOptions
    from inference.compare.reference import Reference

REPORT_SCHEMA = "msrl-consistency/verify-report"
REPORT_SCHEMA_VERSION = 2
STATUS_MARK = {"pass": "PASS", "fail": "FAIL", "warn": "warn", "skip": "skip", "error": "ERROR"}


@dataclass
class Check:
    runtime: str
    name: str
    status: str  # pass | fail | warn | skip | error (could not be judged: never a pass, never a verdict)
    summary: str
    metrics: dict[str, Any] = field(default_factory=dict)
    diagnosis: dict[str, str] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class VerifyResult:
    bundle: Bundle
    options: VerifyOptions
    checks: list[Check]
    runtimes: dict[str, dict[str, Any]]
    reference: Reference
    episode_diffs: dict[str, dict[str, np.ndarray]]  # runtime -> mode -> per-step max action difference
    inputs: dict[str, Any] = field(default_factory=dict)  # where observations came from (env, file, golden)
    localizations: dict[str, Localization] = field(default_factory=dict)  # runtime -> its first diverging layer
    command: list[str] | None = None  # the command line that produced this result (``report.json``'s provenance)

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def undecided(self) -> list[Check]:
        """Checks that could not be judged (nothing compared, a runtime killed from outside)."""
        return [c for c in self.checks if c.status == "error"]

    @property
    def compared(self) -> list[str]:
        """Runtimes that produced comparisons against the reference."""
        return [name for name, info in self.runtimes.items() if info.get("status") == "ran"]

    @property
    def ok(self) -> bool:
        return self.exit_code == EXIT_OK

    @property
    def exit_code(self) -> int:
        """1 on any failed check (a verdict); else 3 when something could not be judged; else 0."""
        if self.failed:
            return EXIT_INCONSISTENT
        return EXIT_RUNTIME_UNAVAILABLE if self.undecided else EXIT_OK

    @property
    def verdict(self) -> str:
        """One word for the outcome, as the console and the reports say it."""
        return {EXIT_OK: "CONSISTENT", EXIT_INCONSISTENT: "INCONSISTENT"}.get(self.exit_code, "NOT VERIFIED")

    def verdict_line(self) -> str:
        """The verdict with its count: failed checks, or what could not be judged."""
        if self.failed:
            return f"INCONSISTENT ({len(self.failed)} failed check(s))"
        if self.undecided:
            return "NOT VERIFIED: " + "; ".join(c.summary for c in self.undecided)
        return "CONSISTENT"

    def console_table(self, only_failed: bool = False) -> str:
        """The checks as a text table, then the runtimes not compared, the diverging layers and the verdict."""
        checks = [*self.failed, *self.undecided] if only_failed else self.checks
        rows = [("runtime", "check", "status", "details")]
        for c in checks:
            detail = c.summary if not c.diagnosis else f"{c.summary} → {c.diagnosis['stage']}: {c.diagnosis['detail']}"
            rows.append((c.runtime, c.name, STATUS_MARK[c.status], detail))
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [" | ".join(r[i].ljust(widths[i]) for i in range(3)) + " | " + r[3] for r in rows]
        lines.insert(1, "-+-".join("-" * w for w in widths) + "-+-" + "-" * 20)
        named = {c.runtime for c in self.checks}
        idle = [f"{name} ({info['status']}: {info.get('reason', '')})" for name, info in self.runtimes.items()
                if name not in named and info.get("status") not in ("ran", "reference")]  # fmt: skip
        if idle and not only_failed:
            lines.append("\nnot compared here: " + "; ".join(idle))
        emulated = [f"{name}: {info['versions']['emulation']}" for name, info in self.runtimes.items()
                    if (info.get("versions") or {}).get("emulation")]  # fmt: skip
        if emulated:  # the kernels of another CPU, run here instruction by instruction: said with the verdict
            lines.append("\n" + "\n".join(emulated))
        if not only_failed:
            lines += self._precision_lines()
        if self.localizations:
            lines.append("")
            lines += [loc.line() for loc in self.localizations.values()]
        return "\n".join(lines) + f"\n\n{self.verdict_line()}"

    def _precision_lines(self) -> list[str]:
        """What each compared runtime computes in and was judged with; the batch-invariance matrix."""
        from inference.compare.judge.batch_invariance import describe

        lines = []
        for name, info in self.runtimes.items():
            p = info.get("precision")
            if p and info.get("status") == "ran":
                lines.append(f"{name}: computes in {p['computes_in']} (judged as {p['judged_as']}): {p['why']}")
            if info.get("reference"):
                lines.append(f"{name}: judged against {info['reference']}")
            if info.get("batch_invariance"):
                lines.append(f"{name}: batch invariance: {describe(info['batch_invariance'])}")
        gated = {(c.runtime, c.name.split(".", 1)[1]) for c in self.checks if c.name.startswith("policy.")}
        for c in self.checks:  # a comparison without a policy gate (an audit): its mismatch numbers, said too
            m = ((c.metrics or {}).get("log_ratio") or {}).get("mismatch") or {}
            graph = c.name.split(".", 1)[-1]
            if c.name.startswith("observations.") and m.get("count") and (c.runtime, graph) not in gated:
                lines.append(f"{c.runtime}: {graph}: mean exp|Δ log π| {m['mean_exp_abs']:.6f}, ESS {m['ess']:.4f}, "
                             f"k3 KL {m['k3_kl']:.2e} ({m['count']} sampled actions)")  # fmt: skip
        return ["", *lines] if lines else []


def version_checks(bundle: Bundle, runtimes: dict[str, dict[str, Any]]) -> list[Check]:
    """A runtime on another MindSpore major.minor than the exporter's gets a warning naming both."""
    exporter = bundle.manifest.get("exporter") or {}
    checks = []
    for name, info in runtimes.items():
        ms_version = info.get("versions", {}).get("mindspore")
        exported = exporter.get("mindspore")
        if ms_version and exported and ms_version.split(".")[:2] != exported.split(".")[:2]:
            checks.append(
                Check(name, "version_contract", "warn", f"exported with MindSpore {exported}, running {ms_version}")
            )
    return checks
