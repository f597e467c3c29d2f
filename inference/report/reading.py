"""One reading of a run's reports, shared by the page (``html``) and ``python -m inference.report diff``.

A run is its ``report.json`` (and, for an audit, ``audit.json``). Everything here reads those documents and nothing
else, tolerating fields it does not know and older reports that lack the newer ones: the verdict, the first
failure with its stage, the stage strip, each gate's value against its threshold, the per-output statistics, the
first diverging layer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference.compare.checks import REPORT_SCHEMA
from inference.errors import UsageError

# The pipeline a bundle goes through, in order, and the runtimes that run each of its artefacts. A check whose
# diagnosis blames the runtime itself (a defect, a version) belongs to the last box, as does a device's recording; one
# blamed on a lowered precision (fp16, int8: a precision plan, a target computing in fp16) to the "precision" box,
# with the emulation of the device's fp16.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("checkpoint", ("bundle",)),  # was the bundle exported from the checkpoint verify was given (provenance)
    ("Cell", ("ms-cell", "ms-graph")),
    ("MindIR", ("ms-mindir", "lite-mindir")),
    ("ONNX", ("onnxruntime",)),
    (".ms", ("lite", "lite-python", "lite-aarch64")),
    ("precision", ("emulated-fp16",)),
    ("runtime", ()),
)
RUNTIME_STAGES = {"runtime", "version"}
SEVERITY = {"fail": 0, "error": 1, "warn": 2, "pass": 3, "skip": 4}


@dataclass
class Stage:
    name: str
    status: str  # fail | error | warn | pass | skip (nothing ran there)
    runtimes: list[str]
    first_failure: bool = False
    failing: list[str] = field(default_factory=list)  # the checks failing there


@dataclass
class Gate:
    """One check's measured value against the threshold it is judged by, and where its evidence is on the page."""

    runtime: str
    check: str
    status: str
    measured: str
    threshold: str
    anchor: str


@dataclass
class Run:
    """A run's report documents: ``data`` (report.json), ``audit`` (audit.json, for audits), ``where`` it was read."""

    data: dict[str, Any]
    audit: dict[str, Any] | None = None
    where: str = ""
    _stage_of: dict[str, str] = field(default_factory=dict, repr=False)

    # ---- the verdict ----------------------------------------------------------------------------------------
    @property
    def checks(self) -> list[dict[str, Any]]:
        return [c for c in self.data.get("checks") or [] if isinstance(c, dict)]

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [c for c in self.checks if c.get("status") == "fail"]

    @property
    def verdict(self) -> str:
        code = self.data.get("exit_code")
        return {0: "CONSISTENT", 1: "INCONSISTENT"}.get(code, "NOT VERIFIED")  # type: ignore[arg-type]

    @property
    def verdict_line(self) -> str:
        if self.data.get("verdict"):
            return str(self.data["verdict"])
        if self.failed:
            return f"INCONSISTENT ({len(self.failed)} failed check(s))"
        return self.verdict

    @property
    def subject(self) -> str:
        inputs, bundle = self.data.get("inputs") or {}, self.data.get("bundle") or {}
        if self.is_audit:
            return str(bundle.get("env_id") or Path(str(bundle.get("path", "run"))).name)
        return str(inputs.get("env") or inputs.get("recorded_observations") or bundle.get("env_id")
                   or Path(str(bundle.get("path", "run"))).name)  # fmt: skip

    @property
    def is_audit(self) -> bool:
        return self.audit is not None or any(c.get("name", "").startswith("field.") for c in self.checks)

    @property
    def runtimes(self) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in (self.data.get("runtimes") or {}).items() if isinstance(v, dict)}

    @property
    def compared(self) -> list[str]:
        return [name for name, info in self.runtimes.items() if info.get("status") == "ran"]

    @property
    def localization(self) -> dict[str, dict[str, Any]]:
        return {k: v for k, v in (self.data.get("localization") or {}).items() if isinstance(v, dict)}

    @property
    def provenance(self) -> dict[str, Any]:
        return self.data.get("provenance") or {}

    # ---- where it failed ------------------------------------------------------------------------------------
    def stage_of(self, check: dict[str, Any]) -> str | None:
        """The strip's box a check belongs to (None: not a step of the pipeline, e.g. the env or the inputs)."""
        runtime = str(check.get("runtime", ""))
        if (check.get("diagnosis") or {}).get("stage") in RUNTIME_STAGES or runtime.startswith("field:"):
            return "runtime"
        if (check.get("diagnosis") or {}).get("stage") == "precision":
            return "precision"
        return next((name for name, members in STAGES if runtime in members), None)

    def stage_name(self, check: dict[str, Any]) -> str:
        """The stage a check's failure is blamed on: its diagnosis, else what the check itself is about."""
        stage = (check.get("diagnosis") or {}).get("stage")
        if stage:
            return str(stage)
        named = {"provenance": "provenance", "repeatability": "runtime", "baseline": "baseline"}.get(
            str(check.get("name"))
        )
        if named:
            return named
        # a bundle not exported from the checkpoint it is compared with: every difference follows from that
        return "provenance" if self.provenance_failed else "undiagnosed"

    @property
    def provenance_failed(self) -> bool:
        return any(c.get("name") == "provenance" and c.get("status") == "fail" for c in self.checks)

    def stages(self) -> list[Stage]:
        """The strip: each box's worst status over its checks, with the first failing box marked."""
        out = []
        for name, members in STAGES:
            mine = [c for c in self.checks if self.stage_of(c) == name]
            ran = sorted(
                {str(c.get("runtime")) for c in mine if c.get("runtime") not in ("bundle",)}
                | {r for r in members if self.runtimes.get(r, {}).get("status") in ("ran", "reference")}
            )
            ran += [f"bundle {c.get('name')}" for c in mine if c.get("runtime") == "bundle"]
            status = min((str(c.get("status", "skip")) for c in mine), key=lambda s: SEVERITY.get(s, 9), default="skip")
            failing = [
                f"{c.get('runtime')} {c.get('name')}" if c.get("runtime") == "bundle" else str(c.get("name"))
                for c in mine
                if c.get("status") in ("fail", "error")
            ]
            out.append(Stage(name, status, ran, failing=failing))
        first = next((s for s in out if s.status in ("fail", "error")), None)
        if first is not None:
            first.first_failure = True
        return out

    def first_failure(self) -> dict[str, Any] | None:
        """The failing check earliest along the pipeline (then in report order); else the first undecided one."""
        order = {name: k for k, (name, _) in enumerate(STAGES)}
        bad = self.failed or [c for c in self.checks if c.get("status") == "error"]
        if not bad:
            return None
        return min(bad, key=lambda c: (order.get(self.stage_of(c) or "", len(order)), self.checks.index(c)))

    def failing_runtimes(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for c in self.checks:
            if c.get("status") in ("fail", "error"):
                out.setdefault(str(c.get("runtime")), []).append(c)
        return out

    def diverging(self) -> list[dict[str, Any]]:
        """Each localised runtime's first diverging layer (with its row of the layer table), diverging ones first."""
        rows = []
        for name, loc in self.localization.items():
            first = loc.get("first_diverging_layer")
            head = next((r for r in loc.get("layers") or [] if r.get("scope") == first), {}) if first else {}
            rows.append({"runtime": name, "layer": first, "kind": loc.get("first_diverging_kind"), "row": head,
                         "message": loc.get("message", ""), "method": loc.get("method", "")})  # fmt: skip
        return sorted(rows, key=lambda r: r["layer"] is None)

    # ---- what was measured ----------------------------------------------------------------------------------
    def output_rows(self) -> Iterator[tuple[dict[str, Any], str, str, dict[str, Any]]]:
        """(check, graph, output, statistics) for every output every runtime was compared on."""
        for c in self.checks:
            name = str(c.get("name", ""))
            if not name.startswith("observations."):
                continue
            for output, stats in ((c.get("metrics") or {}).get("outputs") or {}).items():
                if isinstance(stats, dict):
                    yield c, name.split(".", 1)[1], output, stats

    def gates(self) -> list[Gate]:
        return [Gate(str(c.get("runtime")), str(c.get("name")), str(c.get("status")), *gate_values(c), anchor(c))
                for c in self.checks]  # fmt: skip


def anchor(check: dict[str, Any]) -> str:
    """The page's id of a check's evidence: its per-output table, its episodes, its layers, or its own row."""
    runtime, name = str(check.get("runtime")), str(check.get("name"))
    if name.startswith("observations."):
        return slug(f"out-{runtime}-{name.split('.', 1)[1]}")
    if name.startswith("episodes."):
        return slug(f"ep-{runtime}")
    if name.startswith("field."):
        return "audit"
    return slug(f"check-{runtime}-{name}")


def slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in text)


def num(v: Any) -> str:
    from inference.report.svg import fmt

    return fmt(float(v)) if isinstance(v, (int, float)) and not isinstance(v, bool) else "–"


def gate_values(c: dict[str, Any]) -> tuple[str, str]:
    """(measured, threshold) of one check, in words a reader can hold against each other."""
    name, m = str(c.get("name", "")), c.get("metrics") or {}
    if name.startswith("observations."):
        outputs = {k: v for k, v in (m.get("outputs") or {}).items() if isinstance(v, dict) and not v.get("exact")}
        flips = m.get("flips") or {}
        parts, limits = [], []
        if outputs:
            worst = max(outputs.values(), key=lambda s: ratio(s.get("max_abs"), s.get("atol")))
            beyond = sum(int(s.get("mismatches") or 0) for s in outputs.values())
            total = sum(int(s.get("count") or 0) for s in outputs.values())
            parts.append(f"{beyond} of {total} elements beyond tolerance; worst {worst.get('name')} max abs "
                         f"{num(worst.get('max_abs'))}, max rel {num(worst.get('max_rel'))}")  # fmt: skip
            limits.append(f"0 elements beyond atol {num(worst.get('atol'))} and rtol {num(worst.get('rtol'))}")
        if flips:
            parts.append(f"{flips.get('flips', 0)} action flip(s) of {flips.get('count', 0)}, "
                         f"{flips.get('explained', 0)} within the scores' tolerance")  # fmt: skip
            limits.append(f"flips only at near-ties, ≤ {100 * float(flips.get('max_rate') or 0):g}% of rows")
        return "; ".join(parts) or str(c.get("summary", "")), "; ".join(limits) or "–"
    if name.startswith("episodes.teacher_forced"):
        return (
            f"{m.get('differing_actions', 0)} of {m.get('steps', 0)} actions differ "
            f"({m.get('near_ties_forgiven', 0)} at near-ties)",
            "0, or near-ties within the flip rate",
        )
    if name.startswith("episodes.free_running"):
        measured = (
            f"{m.get('episodes_diverged', 0)} episode(s) diverge; mean return Δ {num(m.get('mean_return_delta'))}"
        )
        if "mean_return_bound" in m:
            return (
                measured + f"; mean return {num(m.get('mean_return'))} vs {num(m.get('reference_mean_return'))},"
                f" KS p {num(m.get('ks_p_value'))}",
                f"mean within ±{num(m.get('mean_return_bound'))}, KS p ≥ 0.01",
            )
        return measured, "0, or parted at a near-tie / by chaotic amplification"
    if name.startswith("policy."):  # the mismatch in policy terms against the bounds of the precision judged
        mm, flips, b = m.get("mismatch") or {}, m.get("flips") or {}, m.get("bounds") or {}
        parts = [f"mean exp|Δ log π| {num(mm.get('mean_exp_abs'))}, ESS {num(mm.get('ess'))}, k3 KL "
                 f"{num(mm.get('k3_kl'))}"] if mm.get("count") else []  # fmt: skip
        if flips:
            parts.append(f"flip rate {num(flips.get('rate'))} (95% upper bound {num(flips.get('ucb'))})")
        limits = [f"{b.get('preset')}: mean exp|Δ log π| ≤ {num(b.get('mean_exp_abs'))}, ESS ≥ {num(b.get('ess'))}, "
                  f"k3 KL ≤ {num(b.get('k3_kl'))}"] if b else []  # fmt: skip
        if b.get("flip_rate_ucb") is not None:
            limits.append(f"flip rate upper bound ≤ {num(b.get('flip_rate_ucb'))}")
        return "; ".join(parts) or str(c.get("summary", "")), "; ".join(limits) or "–"
    if name == "provenance":
        return f"checkpoint {short(m.get('checkpoint_sha256'))}", f"bundle's {short(m.get('bundle_checkpoint_sha256'))}"
    if name == "field.drift":
        worst = max((float(w.get("worst_ratio") or 0) for w in m.get("windows") or []), default=0.0)
        return f"worst window {num(worst)} of the tolerance", "error does not grow over time"
    if name == "field.out_of_distribution" and "share_beyond_sigma" in m:
        return (
            f"{100 * float(m['share_beyond_sigma']):.2f}% beyond {num(m.get('sigma'))} std, "
            f"{100 * float(m.get('share_clipped') or 0):.2f}% clipped",
            "≤ 1% beyond, none clipped",
        )
    if name == "baseline":
        return f"{len(m.get('regressions') or [])} metric(s) beyond their margins", "0"
    return str(c.get("summary", "")), "–"


def ratio(value: Any, limit: Any) -> float:
    try:
        v, t = float(value), float(limit)
    except (TypeError, ValueError):
        return 0.0
    return v / t if t > 0 and math.isfinite(v) else (math.inf if v > 0 else 0.0)


def short(digest: Any, n: int = 12) -> str:
    return str(digest)[:n] if digest else "–"


# ---- reading from disk ----------------------------------------------------------------------------------------


def load_run(path: str | Path) -> Run:
    """A report directory (or its report.json) as a ``Run``; ``UsageError`` with one line when it is not one."""
    path = Path(path)
    if path.is_dir():
        report, audit = path / "report.json", path / "audit.json"
    else:
        report, audit = path, path.with_name("audit.json")
    if not path.exists():
        raise UsageError(f"no report at {path}")
    if not report.is_file():
        raise UsageError(f"{path} holds no report.json: pass a report directory or its report.json")
    data = read_json(report, "report")
    if not isinstance(data, dict) or data.get("schema") != REPORT_SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise UsageError(f"{report} is not a verify report (schema {got!r}, expected {REPORT_SCHEMA!r})")
    if not isinstance(data.get("checks"), list) or "exit_code" not in data:
        raise UsageError(f"{report} is incomplete: it has no checks or no exit code")
    facts = read_json(audit, "audit facts") if audit.is_file() else None
    return Run(data, facts if isinstance(facts, dict) else None, str(path))


def read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"{what} {path} is not valid JSON: {exc}") from None
