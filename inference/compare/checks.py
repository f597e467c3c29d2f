"""Result types of a consistency check: every comparison is a ``Check``; a run is a ``VerifyResult``.

The report writers (``inference.report``) read these and nothing else, so the same reports come out
whether the reference was the training path or a golden file.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from inference.bundle import Bundle
from inference.errors import EXIT_INCONSISTENT, EXIT_OK

if TYPE_CHECKING:
    from inference.compare.reference import Reference
    from inference.compare.verifier import VerifyOptions

REPORT_SCHEMA = "msrl-consistency/verify-report"
REPORT_SCHEMA_VERSION = 2


@dataclass
class Check:
    runtime: str
    name: str
    status: str  # pass | fail | warn | skip
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

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.status == "fail"]

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.ok else EXIT_INCONSISTENT

    def console_table(self, only_failed: bool = False) -> str:
        from inference.report.writers import console_table

        return console_table(self, only_failed=only_failed)

    def write_reports(self, out_dir: str | Path) -> dict[str, Path]:
        """report.json, report.md, junit.xml and action_diff.png in ``out_dir``."""
        from inference.report.writers import write_reports

        return write_reports(self, Path(out_dir))
