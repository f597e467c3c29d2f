"""Read ``mind_ir_version`` from a MindIR file without MindSpore.

The deploy side's reader (``inference.mindir``) is the one home of the rule, so the exporter's manifest and
the deploy box's checks can never read a file differently.
"""

from __future__ import annotations

from inference.mindir import MindIRHeader, mindir_version, read_header

__all__ = ["MindIRHeader", "mindir_version", "read_header"]
