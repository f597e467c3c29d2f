"""Read and check an exported bundle (``manifest.json`` + graph files). NumPy and stdlib only.

This is the deploy side's view of the bundle: it verifies every file's SHA-256 before anything runs,
so a tampered or truncated graph is refused with a one-line reason instead of producing wrong actions.

Schema v2 records a policy contract (``inference.bundle.contract``) per graph, so a bundle exported from any
policy Cell says how its outputs become env actions. v1 bundles (our trainer's, before contracts) still
load: their contracts are derived from the recorded ``policy_spec`` (``inference.bundle.v1``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inference.bundle import schema
from inference.bundle.contract import ContractError, PolicyContract
from inference.bundle.files import read_document, sha256_file  # noqa: F401 - sha256_file: part of this module's API
from inference.bundle.mindir import read_header
from inference.bundle.precision_mode import config_files, file_entry, plan_of, target_of
from inference.bundle.toml_fields import MAX_ROW_ELEMENTS
from inference.bundle.v1 import v1_contracts

MANIFEST = "manifest.json"
SCHEMA = "msrl-consistency/bundle"
SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
MODES = ("deterministic", "stochastic")
LITE_FORMATS = ("auto", "ms", "mindir")  # which graph file Lite loads (``Bundle.lite_format``)


class BundleError(Exception):
    """The bundle is missing, incomplete, of an unknown schema, or does not match its hashes."""

    exit_code = 2


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
    def target(self) -> dict[str, Any]:
        """The device the bundle was exported for and its Lite precision mode (``precision.target_of``: a manifest
        without one is a CPU bundle)."""
        return target_of(self.manifest)

    @property
    def plan(self) -> dict[str, Any] | None:
        """The precision plan the ``.ms`` follows (``python -m msrl_consistency.precision``), if any."""
        return plan_of(self.manifest)

    def defaults(self) -> dict[str, str]:
        """Optional manifest fields this bundle leaves out, with what the verifier assumes instead (the schema's
        ``default``); the report lists them."""
        return schema.optional_defaults(self.manifest, schema.load_schema())

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
            return v1_contracts(spec, log_std, self.env_id, sample_outputs)[graph]
        except (ContractError, KeyError) as exc:
            raise BundleError(f"bundle {self.root}: graph {graph!r} has no usable policy contract ({exc})") from None

    def mode_graph(self, mode: str) -> str | None:
        """The graph that acts in ``mode``: deterministic → the first graph without a noise input, else the first
        noise-input graph whose contract defines a deterministic action (fed zero noise: the squashed Gaussian mean,
        the argmax of the scores; ``PolicyContract.deterministic_action``); stochastic → the first graph with a
        noise input, else the deterministic graph if it samples on the host."""
        det = next((g for g in self.graphs if not self.contract(g).takes_noise), None)
        if mode == "deterministic":
            return det or next((g for g in self.graphs if self.contract(g).has_deterministic_mode), None)
        sto = next((g for g in self.graphs if self.contract(g).takes_noise), None)
        if sto is None and det is not None and self.contract(det).samples_on_host:
            return det
        return sto

    def file(self, graph: str, fmt: str) -> Path:
        """Path of ``graph`` in format ``mindir`` | ``onnx`` | ``ms``; BundleError if it was not exported."""
        entry = self.graph(graph)["files"].get(fmt)
        if entry and "failed" in entry:
            raise BundleError(f"bundle {self.root}: {graph}.{fmt} failed at export ({entry['failed']})")
        if not entry or "file" not in entry:
            reason = (entry or {}).get("skipped", "not exported")
            raise BundleError(f"bundle {self.root}: no {fmt} file for {graph} ({reason})")
        return self.root / entry["file"]

    def recheck(self, path: Path) -> None:
        """``path`` (a graph file of this bundle) still has the sha256 the manifest records: a file replaced after
        ``load_bundle`` checked it is refused (``BundleError``), not run."""
        recorded = file_entry(self.manifest, path.name).get("sha256")
        if recorded and sha256_file(path) != recorded:
            raise BundleError(f"bundle {self.root}: {path.name} changed after the bundle was loaded (its sha256 no "
                              "longer matches the manifest): not run")  # fmt: skip

    def has_file(self, graph: str, fmt: str) -> bool:
        """Whether ``graph`` has a ``fmt`` file a runtime may load: exported, and not marked failed at export (a file
        that disagreed with its Cell stays in the bundle as evidence; ``file`` refuses it)."""
        entry = self.manifest.get("graphs", {}).get(graph, {}).get("files", {}).get(fmt) or {}
        return "file" in entry and "failed" not in entry

    def lite_format(
        self, graph: str, fmt: str = "auto", lite_version: str | None = None, max_mind_ir_version: int | None = None
    ) -> tuple[str, str]:
        """The file Lite loads for ``graph``, and why: the one rule of ``inference.load``, ``play``, ``bench``,
        ``doctor`` and the ``lite`` runtime of ``check`` and ``verify``. ``auto`` takes the ``.mindir`` where this
        Lite reads its MindIR version (``max_mind_ir_version``: what the Lite build reported; None: unknown), and the
        ``.ms`` otherwise: a ``.ms`` converted by another Lite release may not load where the MindIR does. A file
        marked failed at export is never chosen."""
        if fmt not in LITE_FORMATS:
            raise BundleError(f"unknown format {fmt!r} (one of {', '.join(LITE_FORMATS)})")
        if fmt != "auto":
            self.file(graph, fmt)  # refused now, with its reason, if not exported or failed at export
            return fmt, "requested"
        lite = f"Lite {lite_version}" if lite_version else "this Lite"
        if self.has_file(graph, "mindir"):
            version = read_header(self.file(graph, "mindir")).mind_ir_version
            loads = None if version is None or max_mind_ir_version is None else 0 <= version <= max_mind_ir_version
            limit = f" reads <= v{max_mind_ir_version}" if max_mind_ir_version is not None else ""
            if loads:
                return "mindir", f"MindIR v{version} loads directly in {lite} ({limit.strip()})"
            if self.has_file(graph, "ms"):
                why = f"{lite}{limit}" if loads is False else f"cannot tell whether {lite} reads it"
                return "ms", f"fallback to .ms: MindIR v{version}, {why}"
            ms = self.export_failure("ms") or f"no .ms for {graph}"
            if loads is False:
                raise BundleError(f"bundle {self.root}: {graph} has no file Lite may load: its .mindir is MindIR "
                                  f"v{version}, which {lite}{limit}, and {ms}")  # fmt: skip
            return "mindir", f"{ms}; trying MindIR v{version}"
        if self.has_file(graph, "ms"):
            return "ms", "the bundle has no usable .mindir"
        failed = "; ".join(f for f in (self.export_failure("mindir"), self.export_failure("ms")) if f)
        raise BundleError(f"bundle {self.root}: {graph} has neither a .mindir nor a .ms file Lite may load"
                          + (f" ({failed})" if failed else ""))  # fmt: skip

    def export_failure(self, fmt: str) -> str | None:
        """Why format ``fmt`` failed at export (could not be produced, or disagreed with its Cell), if it did."""
        for graph in self.graphs:
            entry = self.graph(graph)["files"].get(fmt) or {}
            if "failed" in entry:
                return f"{graph}.{fmt} failed at export: {entry['failed']}"
        return None

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
        return int(sum(self.output_shape(graph, head)[-1] for head in contract.action.heads))

    def sample_noise(self, graph: str, rng: np.random.Generator, batch: int) -> np.ndarray:
        """Host noise exactly as training draws it: uniform for Gumbel-max, standard normal for Gaussian."""
        return self.contract(graph).sample_noise(rng, batch, self.noise_dim(graph))


def load_bundle(path: str | Path, verify_hashes: bool = True) -> Bundle:
    """Open a bundle directory (or any file inside it): its manifest valid against the published schema (v2:
    ``manifest.schema.json``), every graph file inside the bundle directory, every hash matching."""
    path = Path(path)
    if not path.exists():  # a mistyped path is named as typed, not as its parent
        raise BundleError(f"{path} does not exist (a bundle is a directory with a {MANIFEST})")
    root = path if path.is_dir() else path.parent
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise BundleError(f"{root} is not a bundle (no {MANIFEST})")
    manifest = read_document(manifest_path, "manifest", BundleError)
    if not isinstance(manifest, dict):
        raise BundleError(f"{manifest_path} is not a manifest (a JSON object)")
    if manifest.get("schema") != SCHEMA or manifest.get("schema_version") not in READABLE_VERSIONS:
        raise BundleError(
            f"{manifest_path}: unsupported schema {manifest.get('schema')!r} v{manifest.get('schema_version')!r}"
        )
    for graph_name, graph in _graph_files(manifest):  # files outside the bundle: said as such, before the schema
        for fmt, entry in graph.items():
            if isinstance(entry, dict) and "file" in entry:
                _inside(root, entry["file"], f"{graph_name}.{fmt}")
    # v1 manifests predate the schema: the fields they hold get its types and ranges, not its required fields
    old = manifest["schema_version"] != SCHEMA_VERSION
    problems = schema.errors({**manifest, "schema_version": SCHEMA_VERSION}, schema.load_schema(), partial=old)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        where = schema.MANIFEST_SCHEMA.name
        raise BundleError(f"{manifest_path}: field {problems[0]}{more}; the schema is {where}")
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
    _check_sizes(bundle, manifest_path)
    for graph_name, graph in graphs.items():
        for fmt, entry in graph["files"].items():
            if "file" not in entry:
                continue
            file = _inside(root, entry["file"], f"{graph_name}.{fmt}")
            if not verify_hashes:
                continue
            if not file.is_file():
                raise BundleError(f"bundle {root}: {graph_name} {fmt} file {entry['file']} is missing")
            if sha256_file(file) != entry["sha256"]:
                raise BundleError(
                    f"bundle {root}: {entry['file']} does not match the manifest's sha256 (modified or truncated)"
                )
    for where, entry in config_files(manifest):  # the Lite configurations the export used: inside, and unchanged
        file = _inside(root, entry["file"], where)
        if verify_hashes and (not file.is_file() or sha256_file(file) != entry["sha256"]):
            raise BundleError(f"bundle {root}: {where} {entry['file']} is missing or does not match the manifest's "
                              "sha256")  # fmt: skip
    return bundle


def _check_sizes(bundle: Bundle, manifest_path: Path) -> None:
    """What the schema cannot say: a graph tensor's row holds at most ``MAX_ROW_ELEMENTS`` values, and the
    per-dimension statistics and bounds of an array observation have one entry per observation value (they are
    broadcast against observations: a longer list would size every synthetic observation)."""
    for graph_name in bundle.graphs:
        for entry in (*bundle.graph(graph_name)["inputs"], *bundle.graph(graph_name)["outputs"]):
            row = [d for d in entry["shape"][1:] if d > 0]
            if math.prod(row) > MAX_ROW_ELEMENTS:
                raise BundleError(f"{manifest_path}: graph {graph_name!r} tensor {entry['name']!r} has shape "
                                  f"{entry['shape']}: {math.prod(row):,} values per row, at most "
                                  f"{MAX_ROW_ELEMENTS:,}")  # fmt: skip
    contract = bundle.contract(bundle.graphs[0])
    if contract.obs_dict:
        return
    size = math.prod(contract.obs_shape)
    norm, env = bundle.manifest.get("normalization") or {}, bundle.manifest.get("env") or {}
    for where, values in (("normalization.mean", norm.get("mean")), ("normalization.var", norm.get("var")),
                          ("env.obs_low", env.get("obs_low")), ("env.obs_high", env.get("obs_high"))):  # fmt: skip
        if values is not None and len(values) != size:
            raise BundleError(f"{manifest_path}: field {where} has {len(values)} entries for an observation of "
                              f"{size} values {list(contract.obs_shape)}")  # fmt: skip


def _graph_files(manifest: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    graphs = manifest.get("graphs")
    if not isinstance(graphs, dict):
        return []
    return [(name, g["files"]) for name, g in graphs.items()
            if isinstance(g, dict) and isinstance(g.get("files"), dict)]  # fmt: skip


def _inside(root: Path, name: object, where: str) -> Path:
    """A graph file of the bundle, which must be a file of the bundle directory itself: a manifest naming
    ``../x.onnx`` or ``/abs/x.onnx``, or a graph file that is a symlink leading elsewhere, is refused (its hash
    would be checked on, and its graph run from, a file the bundle does not hold)."""
    if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
        raise BundleError(f"bundle {root}: {where} names {name!r}, not a file inside the bundle directory")
    file = root / name
    if file.is_symlink() or (file.exists() and file.resolve().parent != root.resolve()):
        raise BundleError(f"bundle {root}: {where} file {name} is a link to {file.resolve()}, outside the bundle")
    return file
