"""What a consistency check is asked to do (``VerifyOptions``): data, checked before any work. A module of its own so
that the result types (``checks``) and the check itself (``verifier``) both read it without reading each other."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from inference.bundle import Bundle
from inference.compare.judge.stats import TOLERANCE_PRESETS, Tolerance
from inference.errors import UsageError
from inference.runtimes.registry import RUNTIMES

LOCALIZE_MODES = ("auto", "always", "never")
LOCALIZE_STAGES = {"network", "precision", "version"}


@dataclass(frozen=True)
class VerifyOptions:
    observations: int = 10_000
    episodes: int = 20
    seed: int = 0
    tolerance: str | None = None  # preset; default: the bundle's precision
    overrides: Mapping[str, Tolerance] = field(default_factory=dict)  # output name -> tolerance
    runtimes: tuple[str, ...] | None = None  # None: every registered runtime that is available
    required: tuple[str, ...] = ()
    device: str = "cpu"
    device_id: int = 0
    # "auto": name the first diverging layer of a runtime that fails at the network, precision or version stage (and
    # of Lite, x86 or ARM, on an fp16 bundle: where the fp16 error grows); "always": of every runtime compared; "never".
    localize: str = "auto"
    # "fp16": add the emulated-fp16 runtime (the bundle's graph as a device computing in fp16 would run it).
    emulate: str | None = None

    def validate(self, bundle: Bundle) -> str:
        """Every argument checked before any work; returns the tolerance preset."""
        if self.observations < 16 or self.episodes < 1:
            raise UsageError("observations must be >= 16 and episodes >= 1")
        if self.emulate not in (None, "fp16"):
            raise UsageError(f"emulate must be fp16, got {self.emulate!r}")
        if self.localize not in LOCALIZE_MODES:
            raise UsageError(f"localize must be one of {', '.join(LOCALIZE_MODES)}, got {self.localize!r}")
        preset = self.tolerance or bundle.precision
        if preset not in TOLERANCE_PRESETS:
            raise UsageError(f"unknown tolerance preset {preset!r}; choose {', '.join(TOLERANCE_PRESETS)}")
        for name in (*(self.runtimes or ()), *self.required):
            if name not in RUNTIMES:
                raise UsageError(f"unknown runtime {name!r}; choose from {', '.join(RUNTIMES)}")
        outputs = {o["name"] for g in bundle.graphs for o in bundle.graph(g)["outputs"]}
        unknown = sorted(set(self.overrides) - outputs)
        if unknown:
            raise UsageError(f"--tol names unknown output(s) {', '.join(unknown)}; the outputs are {sorted(outputs)}")
        return preset
