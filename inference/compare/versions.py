"""The exporter's versions against each runtime's: a version pair that is not known to match is flagged."""

from __future__ import annotations

from typing import Any

from inference.bundle import Bundle
from inference.compare.checks import Check


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
