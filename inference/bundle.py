"""Read and check an exported bundle (``manifest.json`` + graph files). NumPy and stdlib only.

This is the deploy side's view of the bundle: it verifies every file's SHA-256 before anything runs,
so a tampered or truncated graph is refused with a one-line reason instead of producing wrong actions.

Schema v2 records a policy contract (``inference.contract``) per graph, so a bundle exported from any
policy Cell says how its outputs become env actions. v1 bundles (our trainer's, before contracts) still
load: their contracts are derived from the recorded ``policy_spec``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inference.contract import ContractError, PolicyContract, trainer_contracts

MANIFEST = "manifest.json"
SCHEMA = "msrl-consistency/bundle"
SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
MODES = ("deterministic", "stochastic")


class BundleError(Exception):
    """The bundle is missing, incomplete, of an unknown schema, or does not match its hashes."""

    exit_code = 2


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class Bundle:
    root: Path
    manifest: dict[str, Any]

    @property
    def env_id(self) -> str | None:
        """The env the policy was exported for, if the manifest names one (a user's Cell may not)."""
        return self.manifest.get("env_id")

    @property
    def policy_spec(self) -> dict[str, Any] | None:
        """Our trainer's architecture record; None for a bundle exported from a user's own Cell."""
        return self.manifest.get("policy_spec")

    @property
    def precision(self) -> str:
        return self.manifest.get("precision", "fp32")

    @property
    def graphs(self) -> list[str]:
        return list(self.manifest["graphs"])

    def graph(self, name: str) -> dict[str, Any]:
        try:
            return self.manifest["graphs"][name]
        except KeyError:
            raise BundleError(f"bundle {self.root} has no graph {name!r}") from None

    def contract(self, graph: str) -> PolicyContract:
        """How ``graph``'s outputs become env actions (derived from ``policy_spec`` for v1 bundles)."""
        entry = self.graph(graph)
        try:
            if "contract" in entry:
                return PolicyContract.from_dict(entry["contract"])
            spec = self.policy_spec
            if spec is None:
                raise ContractError("no contract and no policy_spec")
            sample_outputs = [o["name"] for o in self.graph("policy_sample")["outputs"]]
            log_std = self.manifest.get("gaussian_log_std")
            return trainer_contracts(spec, log_std, self.env_id, sample_outputs)[graph]
        except (ContractError, KeyError) as exc:
            raise BundleError(f"bundle {self.root}: graph {graph!r} has no usable policy contract ({exc})") from None

    def mode_graph(self, mode: str) -> str | None:
        """The graph that acts in ``mode``: deterministic → the first graph without a noise input;
        stochastic → the first graph with one, else the deterministic graph if it samples on the host."""
        det = next((g for g in self.graphs if not self.contract(g).takes_noise), None)
        if mode == "deterministic":
            return det
        sto = next((g for g in self.graphs if self.contract(g).takes_noise), None)
        if sto is None and det is not None and self.contract(det).samples_on_host:
            return det
        return sto

    def file(self, graph: str, fmt: str) -> Path:
        """Path of ``graph`` in format ``mindir`` | ``onnx`` | ``ms``; BundleError if it was not exported."""
        entry = self.graph(graph)["files"].get(fmt)
        if not entry or "file" not in entry:
            reason = (entry or {}).get("skipped", "not exported")
            raise BundleError(f"bundle {self.root}: no {fmt} file for {graph} ({reason})")
        return self.root / entry["file"]

    def output_shape(self, graph: str, output: str) -> tuple[int, ...]:
        for entry in self.graph(graph)["outputs"]:
            if entry["name"] == output:
                return tuple(entry["shape"])
        raise BundleError(f"bundle {self.root}: graph {graph!r} has no output {output!r}")

    def noise_dim(self, graph: str) -> int:
        """Width of the noise a stochastic action of ``graph`` needs (its noise input, or the host sampler's)."""
        contract = self.contract(graph)
        if contract.takes_noise:
            return int(np.prod(contract.noise_shape))
        return int(self.output_shape(graph, contract.action.distribution_output)[-1])

    def sample_noise(self, graph: str, rng: np.random.Generator, batch: int) -> np.ndarray:
        """Host noise exactly as training draws it: uniform for Gumbel-max, standard normal for Gaussian."""
        return self.contract(graph).sample_noise(rng, batch, self.noise_dim(graph))


def load_bundle(path: str | Path, verify_hashes: bool = True) -> Bundle:
    """Open a bundle directory (or any file inside it) and check its manifest and hashes."""
    path = Path(path)
    root = path if path.is_dir() else path.parent
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise BundleError(f"{root} is not a bundle (no {MANIFEST})")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BundleError(f"{manifest_path} is corrupt: {exc}") from None
    if manifest.get("schema") != SCHEMA or manifest.get("schema_version") not in READABLE_VERSIONS:
        raise BundleError(
            f"{manifest_path}: unsupported schema {manifest.get('schema')!r} v{manifest.get('schema_version')!r}"
        )
    graphs = manifest.get("graphs")
    if not isinstance(graphs, dict) or not graphs:
        raise BundleError(f"{manifest_path}: the manifest lists no graphs")
    for graph_name, graph in graphs.items():
        missing = [key for key in ("inputs", "outputs", "files") if key not in graph]
        if missing:
            raise BundleError(f"{manifest_path}: graph {graph_name!r} lacks {', '.join(missing)}")
    bundle = Bundle(root, manifest)
    for graph_name in graphs:
        bundle.contract(graph_name)  # every contract parses now, or one line says which does not
    if verify_hashes:
        for graph_name, graph in manifest["graphs"].items():
            for fmt, entry in graph["files"].items():
                if "file" not in entry:
                    continue
                file = root / entry["file"]
                if not file.is_file():
                    raise BundleError(f"bundle {root}: {graph_name} {fmt} file {entry['file']} is missing")
                if sha256_file(file) != entry["sha256"]:
                    raise BundleError(
                        f"bundle {root}: {entry['file']} does not match the manifest's sha256 (modified or truncated)"
                    )
    return bundle
