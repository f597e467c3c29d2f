"""What the Lite runner was built against, and which bundle file it should load.

``build_lite.sh`` writes ``msrl-lite-runner.json`` next to the runner: the SDK's version (read from the SDK's
own files), and the highest MindIR version that SDK loads, asked of Lite itself (``msrl-lite-runner --info``
hands Lite a header-only MindIR of version 2^31-1; Lite's refusal names ``mind_ir::Version_MAX``, and it
loads exactly the versions 0..max). When the runner was cross-compiled that probe could not run at build
time, so it runs here on first use. With that, ``auto`` picks the ``.mindir`` where this Lite reads it
(a matched box) and the ``.ms`` otherwise.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from inference.bundle import Bundle
from inference.errors import first_line
from inference.lite.common import RUNNER_NAME, MindIRVersionError, runner_path

INFO_FILE = RUNNER_NAME + ".json"

T = TypeVar("T")


@dataclass(frozen=True)
class RunnerInfo:
    """The runner binary and the facts about the SDK it was built against (None: not known)."""

    runner: Path
    lite_version: str | None
    max_mind_ir_version: int | None
    mind_ir_rule: str
    record: dict[str, Any] = field(default_factory=dict)  # msrl-lite-runner.json as written by build_lite.sh

    def summary(self) -> dict[str, Any]:
        """What ``doctor``, ``bench`` and the reports say of this Lite build (``machine.facts.environment``)."""
        return {
            "runner": str(self.runner),
            "lite_version": self.lite_version,
            "lite_version_source": self.record.get("lite_version_source"),
            "sdk": self.record.get("sdk"),
            "max_mind_ir_version": self.max_mind_ir_version,
            "mind_ir_rule": self.mind_ir_rule,
            "inline": self.record.get("inline"),
        }

    def mindir_loads(self, version: int | None) -> bool | None:
        """Whether this Lite loads a MindIR of ``version`` (None: cannot tell)."""
        if version is None or self.max_mind_ir_version is None:
            return None
        return 0 <= version <= self.max_mind_ir_version


def probe(runner: Path, timeout: float = 60.0) -> dict[str, Any]:
    """``runner --info``: the Lite version and Version_MAX as the linked Lite reports them ({} if it cannot run)."""
    try:
        proc = subprocess.run([str(runner), "--info"], capture_output=True, timeout=timeout, check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else {}
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return {}


def runner_info(runner: str | Path | None = None) -> RunnerInfo | None:
    """Facts about ``runner`` (default: the one ``LiteRunner`` would start); None if there is no runner."""
    path = Path(runner) if runner is not None else runner_path()
    if not path.is_file():
        return None
    record: dict[str, Any] = {}
    info_file = path.parent / INFO_FILE
    if info_file.is_file():
        try:
            record = json.loads(info_file.read_text())
        except (OSError, ValueError):
            record = {}
    version = record.get("lite_version")
    max_v = record.get("max_mind_ir_version")
    rule = str(record.get("mind_ir_rule", ""))
    if version is None or max_v is None:
        probed = probe(path)
        version = version or probed.get("lite_version")
        if max_v is None and probed.get("max_mind_ir_version") is not None:
            max_v = probed["max_mind_ir_version"]
            rule = "probe at run time: " + str(probed.get("mind_ir_probe", ""))
    return RunnerInfo(path, version, max_v if isinstance(max_v, int) else None, rule or "unknown", record)


def choose_format(bundle: Bundle, graph: str, fmt: str, info: RunnerInfo | None) -> tuple[str, str]:
    """``Bundle.lite_format`` with what this Lite build reports of itself (``info``)."""
    if info is None:
        return bundle.lite_format(graph, fmt)
    return bundle.lite_format(graph, fmt, info.lite_version, info.max_mind_ir_version)


def open_graph_file(
    bundle: Bundle, graph: str, fmt: str, opener: Callable[[Path], T], runner: str | Path | None = None
) -> tuple[T, str, str]:
    """``opener`` (Lite in this process, or the runner process) on the file of ``graph`` that ``choose_format``
    picks, with the format it loaded and why: an ``auto`` .mindir that Lite refuses after all falls back to the .ms
    (Lite's own refusal is the reason)."""
    chosen, why = choose_format(bundle, graph, fmt, runner_info(runner))
    try:
        return opener(bundle.file(graph, chosen)), chosen, why
    except MindIRVersionError as exc:
        if fmt != "auto" or chosen != "mindir" or not bundle.has_file(graph, "ms"):
            raise
        return opener(bundle.file(graph, "ms")), "ms", f"fallback to .ms: {first_line(exc)}"
