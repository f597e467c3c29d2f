"""Audit a fleet's recordings: ``verify --bundle B --ckpt C --fleet DIR [--engine local|ray] [--ray-address ADDR]``.

``DIR`` holds one recording per device, in a sub-directory named after the device. Every recording is indexed and
checked first, as ``--audit`` checks one (a malformed recording, or one made with another bundle, is that device's
verdict; the others are still audited). Then an engine (``engines``: this process, or Ray workers) judges every
chunk of every device and folds each into its device's audit in recording order
(``inference.compare.audit.RecordingAudit``), so a device's verdict is the one ``--audit`` gives its recording,
whichever engine ran it. A device whose audit fails is localised here, on the training box.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.bundle import Bundle
from inference.bundle.recording import index_recording
from inference.compare.audit import AuditFacts, RecordingAudit
from inference.compare.checks import VerifyResult
from inference.compare.judge.localize import Localizer
from inference.compare.judge.stats import Tolerance
from inference.errors import EXIT_INCONSISTENT, EXIT_OK, EXIT_RUNTIME_UNAVAILABLE, UsageError, first_line
from msrl_consistency.audit import training_returns
from msrl_consistency.fleet.engines import LocalEngine, RayEngine

CONSISTENT, INCONSISTENT, NOT_VERIFIED = "consistent", "inconsistent", "not verified"
OTHER_BUNDLE, UNREADABLE = "another bundle", "unreadable"
FAILING = (INCONSISTENT, OTHER_BUNDLE)  # what makes the fleet exit 1
ENGINES = ("local", "ray")


@dataclass
class Device:
    """One device's outcome: its verdict, in a word and a line, and the audit behind it (None when not audited)."""

    name: str
    status: str
    detail: str
    result: VerifyResult | None = None
    facts: AuditFacts | None = None


def devices_in(fleet: Path) -> list[Path]:
    """The device recordings of ``fleet``: its sub-directories, by name."""
    if not fleet.is_dir():
        raise UsageError(f"--fleet {fleet} is not a directory (one sub-directory of recordings per device)")
    found = sorted(p for p in fleet.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not found:
        raise UsageError(f"--fleet {fleet} holds no device recordings (one sub-directory per device)")
    return found


def make_engine(name: str, cells: Any, device: str, address: str | None) -> LocalEngine | RayEngine:
    if name == "ray":
        return RayEngine(cells, device, address)
    return LocalEngine(cells, device)


def audit_fleet(
    bundle: Bundle, fleet: Path, cells: Any, checkpoint: Path | None, engine: LocalEngine | RayEngine, *,
    windows: int = 10, tolerance: str | None = None, overrides: Mapping[str, Tolerance] | None = None,
    localizer: Localizer | None = None, localize: str = "auto", progress: Callable[[str], None] = lambda _m: None,
) -> list[Device]:  # fmt: skip
    """Every device of ``fleet`` audited against the training path (see the module docstring), failing first."""
    done: dict[str, Device] = {}
    audits: dict[str, RecordingAudit] = {}
    returns = training_returns(checkpoint)
    for path in devices_in(fleet):
        try:
            index = index_recording([path], bundle)
        except UsageError as exc:
            status = OTHER_BUNDLE if "recorded with another bundle" in str(exc) else UNREADABLE
            done[path.name] = Device(path.name, status, first_line(exc))
            progress(f"fleet: {path.name}: {status}: {first_line(exc)}")
            continue
        audits[path.name] = RecordingAudit(
            bundle, index, cells=cells, checkpoint=checkpoint, windows=windows, training_returns=returns,
            tolerance=tolerance, overrides=overrides,
        )  # fmt: skip
    total = sum(len(a.index.chunks) for a in audits.values())
    progress(f"fleet: {len(audits)} device recordings to audit, {total} chunks, engine {engine.name}")
    for audited in engine.audit(audits):
        name = audited.device
        if audited.run is None:
            done[name] = Device(name, NOT_VERIFIED, audited.error or "not audited")
        else:
            done[name] = _finished(name, audited.run, localizer, localize)
        progress(f"fleet: {name}: {done[name].status} ({len(done)} devices)")
    return sorted(done.values(), key=lambda d: (d.status == CONSISTENT, d.status == NOT_VERIFIED, d.name))


def _finished(name: str, run: RecordingAudit, localizer: Localizer | None, localize: str) -> Device:
    result, facts = run.finish(localizer, localize)
    status = CONSISTENT if result.ok else INCONSISTENT if result.failed else NOT_VERIFIED
    failed = [f"{c.name} ({c.diagnosis['stage']})" if c.diagnosis else c.name for c in result.failed]
    detail = f"failed: {', '.join(failed)}" if failed else result.verdict_line()
    return Device(name, status, detail, result, facts)


def exit_code(devices: list[Device]) -> int:
    """1 when a device is inconsistent or ran another bundle; else 3 when none could be audited or one could not be
    judged; else 0."""
    if any(d.status in FAILING for d in devices):
        return EXIT_INCONSISTENT
    return EXIT_OK if all(d.status == CONSISTENT for d in devices) else EXIT_RUNTIME_UNAVAILABLE
