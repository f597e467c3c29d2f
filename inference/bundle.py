"""Read and check an exported bundle (``manifest.json`` + graph files). NumPy and stdlib only.

This is the deploy side's view of the bundle: it verifies every file's SHA-256 before anything runs,
so a tampered or truncated graph is refused with a one-line reason instead of producing wrong actions.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST = "manifest.json"
SCHEMA = "msrl-consistency/bundle"
SCHEMA_VERSION = 1


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
    def env_id(self) -> str:
        return self.manifest["env_id"]

    @property
    def policy_spec(self) -> dict[str, Any]:
        return self.manifest["policy_spec"]

    @property
    def discrete(self) -> bool:
        return self.policy_spec["action_kind"] == "discrete"

    def graph(self, name: str) -> dict[str, Any]:
        try:
            return self.manifest["graphs"][name]
        except KeyError:
            raise BundleError(f"bundle {self.root} has no graph {name!r}") from None

    def file(self, graph: str, fmt: str) -> Path:
        """Path of ``graph`` in format ``mindir`` | ``onnx`` | ``ms``; BundleError if it was not exported."""
        entry = self.graph(graph)["files"].get(fmt)
        if not entry or "file" not in entry:
            reason = (entry or {}).get("skipped", "not exported")
            raise BundleError(f"bundle {self.root}: no {fmt} file for {graph} ({reason})")
        return self.root / entry["file"]

    def sample_noise(self, rng: np.random.Generator, batch: int) -> np.ndarray:
        """Host noise exactly as training draws it: uniform for Gumbel-max, standard normal for Gaussian."""
        dim = self.manifest["noise"]["dim"]
        if self.manifest["noise"]["kind"] == "uniform":
            return rng.random((batch, dim), dtype=np.float32)
        return rng.standard_normal((batch, dim), dtype=np.float32)


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
    if manifest.get("schema") != SCHEMA or manifest.get("schema_version") != SCHEMA_VERSION:
        raise BundleError(
            f"{manifest_path}: unsupported schema {manifest.get('schema')!r} v{manifest.get('schema_version')!r}"
        )
    bundle = Bundle(root, manifest)
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
