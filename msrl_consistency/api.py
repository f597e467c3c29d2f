"""The library API: export and verify a policy, ours or any team's own ``nn.Cell``.

    from msrl_consistency import verify_policy
    result = verify_policy(net, "contract.toml", "policy_model.mindir", env_id="Pendulum-v1")
    assert result.ok, result.console_table(only_failed=True)

``export_run`` / ``verify_run`` serve runs of our trainer; ``export_policy`` / ``verify_policy`` take a team's
Cell (an object, or ``MODULE:FACTORY``), its checkpoint and a contract. All four compose the same pieces:
graph writers (``artifacts``), runtimes, the comparison (``compare``) and the reports.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from mindspore import nn

import msrl_consistency.envs  # noqa: F401 - registers our own env ids with gymnasium (verify looks them up)
import msrl_consistency.runtimes  # noqa: F401 - registers the MindSpore runtimes with inference.runtimes
from inference.bundle import SCHEMA, SCHEMA_VERSION, Bundle, BundleError, load_bundle, sha256_file
from inference.bundle.contract import ContractError, PolicyContract
from inference.bundle.mindir import mindir_version
from inference.compare.checks import VerifyResult
from inference.compare.inputs import Inputs, check_same_contract, resolve_inputs
from inference.compare.reference import Reference
from inference.compare.verifier import VerifyOptions, verify
from inference.errors import UsageError, first_line
from msrl_consistency import compat
from msrl_consistency.agent import ActorCritic, PolicySpec
from msrl_consistency.agent.lowered import freeze
from msrl_consistency.artifacts import graphs as G
from msrl_consistency.artifacts import run_dir as rd
from msrl_consistency.artifacts.bundle import (
    ExportCheckFailed,
    ExportOptions,
    GraphExport,
    half_precision,
    normalization_hash,
    write_bundle,
)
from msrl_consistency.artifacts.cells import TrainerCells, UserCells
from msrl_consistency.artifacts.checkpoint import load_policy
from msrl_consistency.artifacts.export_env import export_env
from msrl_consistency.artifacts.selfcheck import self_check
from msrl_consistency.localization import CellLocalizer, localize

ContractLike = PolicyContract | str | Path | Mapping[str, Any]
CellLike = nn.Cell | str | Callable[[], nn.Cell]


def as_contract(contract: ContractLike) -> PolicyContract:
    """A contract from an object, a TOML path or the TOML layout as a dict; ``ContractError`` says what is wrong."""
    if isinstance(contract, PolicyContract):
        contract.validate()
        return contract
    if isinstance(contract, str | Path):
        return PolicyContract.from_toml(contract)
    return PolicyContract.from_dict(contract)


# -- export -----------------------------------------------------------------------------------------------
@compat.gc_frozen()
def export_run(
    ckpt: Path, out: Path, options: ExportOptions, policy: ActorCritic | None = None, force: bool = False
) -> Bundle:
    """Export a run of our trainer (``ckpt`` with its run.json beside it). ``policy`` overrides the loaded Cell,
    which is how tests build deliberately broken bundles."""
    options.validate()
    compat.set_device("cpu")
    run = rd.read_run_json(ckpt.parent)
    spec = PolicySpec.from_dict(run["policy_spec"])
    reference = policy if policy is not None else freeze(load_policy(ckpt, spec))  # trained lowered: float graphs
    exported = reference
    if options.precision == "fp16":
        exported = ActorCritic(spec)  # a copy (Parameters and switches): the fp32 reference stays untouched
        for (_, dst), (_, src) in zip(exported.parameters_and_names(), reference.parameters_and_names(), strict=True):
            dst.set_data(src.value())
        exported.normalizer.enabled = reference.normalizer.enabled
        if not spec.discrete:
            exported.postprocess.enabled = reference.postprocess.enabled
    heads = G.export_heads(exported, options.precision)
    fp32_heads = G.export_heads(reference) if options.precision == "fp16" else heads
    log_std = None if spec.discrete else reference.log_std.asnumpy().tolist()
    contracts = G.trainer_contracts(spec, log_std, run["env_id"])
    graphs = {
        name: GraphExport(io, heads[name], contracts[name], fp32_heads[name])
        for name, io in G.trainer_graphs(spec).items()
    }
    fields = {
        "env_id": run["env_id"],
        "env": run["env"],
        "policy_spec": spec.to_dict(),
        "action_postprocess": None if spec.discrete else {
            "mode": spec.action_postprocess, "low": spec.action_low, "high": spec.action_high},
        "gaussian_log_std": log_std,  # the state-independent std: KL from the exported mean alone
        "normalization": {
            "enabled": spec.normalize_obs,
            "clip": spec.clip_obs,
            "mean": reference.normalizer.mean.asnumpy().tolist(),
            "var": reference.normalizer.var.asnumpy().tolist(),
            "sha256": normalization_hash(reference),
        },
        "noise": {
            "kind": spec.noise_kind,
            "dim": spec.noise_dim,
            "generator": "numpy.random.Generator(PCG64): random() for uniform, standard_normal() for normal, float32",
            "training_stream": run["seeds"]["noise"],
        },
        "source": {
            "kind": "msrl-trainer",
            "checkpoint": str(ckpt.resolve()),
            "checkpoint_sha256": sha256_file(ckpt),
            "run_json_sha256": sha256_file(ckpt.parent / rd.RUN_JSON),
            "global_step": run["global_step"],
            "train_versions": run["versions"],
            "git_commit": run.get("git_commit"),
        },
        "seeds": {"train": run["seeds"]},
    }  # fmt: skip
    if spec.lower == "fp32" or policy is not None:
        return write_bundle(out, graphs, fields, options, _checker(options), force)
    from msrl_consistency.precision.trained import export_trained  # trained in the device's numerics: its plan

    return export_trained(
        ckpt,
        load_policy(ckpt, spec),
        out,
        force,
        lambda where: write_bundle(where, graphs, fields, options, _checker(options), True),
    )


@compat.gc_frozen()
def export_policy(
    cell: CellLike,
    contract: ContractLike,
    out: str | Path,
    checkpoint: str | Path | None = None,
    options: ExportOptions | None = None,
    force: bool = False,
    env: str | Callable[[], Any] | None = None,
) -> Bundle:
    """Export a team's own policy Cell as a bundle (MindIR with a dynamic batch, ONNX, Lite ``.ms``, manifest).

    ``cell`` is a Cell object, a factory, or ``"MODULE:FACTORY"``; ``checkpoint`` is loaded strictly into it (the
    optimizer state and counters MindSpore saves with a network are listed in the manifest, not loaded). ``env``: the
    env the policy acts in (a registered id, ``"MODULE:FACTORY"`` or a constructor; default the contract's
    ``env_id``), whose spaces the contract is checked against before anything is written.
    """
    options = options or ExportOptions()
    options.validate()
    compat.set_device("cpu")
    contract = _contract_or_usage(contract)
    checkpoint = None if checkpoint is None else Path(checkpoint)
    cells = UserCells(cell, checkpoint)
    cells.constants = contract.constants
    with cells.caller_mode_kept():
        return _export_cells(cells, contract, Path(out), checkpoint, options, force, env)


def _export_cells(
    cells: UserCells, contract: PolicyContract, out: Path, checkpoint: Path | None, options: ExportOptions, force: bool,
    env_arg: str | Callable[[], Any] | None = None,
) -> Bundle:  # fmt: skip
    target = export_env(contract, env_arg)  # before the Cell runs: a contract for another env fails on its inputs
    built = cells()
    io = _probe(built, contract, "the Cell")
    target.check_outputs(contract, io.outputs)
    if _differs_on_rerun(built, contract):
        raise ExportCheckFailed(
            "the Cell gives different outputs for the same input on two calls: sampling inside the graph cannot be "
            "reproduced by another runtime; take the noise as an input ([input] noise in the contract)"
        )
    exported = _half_precision(cells, built, contract, io) if options.precision == "fp16" else built
    if target.env_id != contract.env_id:
        contract = contract.with_env(target.env_id)  # --env names the env the bundle acts in
    fields = {
        "env_id": target.env_id,
        "env": target.info,
        "source": {
            "kind": "cell",
            "cell": cells.label,
            "checkpoint": None if checkpoint is None else str(Path(checkpoint).resolve()),
            "checkpoint_sha256": None if checkpoint is None else sha256_file(checkpoint),
        },
    }
    if target.factory is not None:
        fields["source"]["env_factory"] = target.factory
    if cells.ignored:  # optimizer state and counters saved with the network: listed, not loaded
        fields["source"]["checkpoint_ignored"] = list(cells.ignored)
    graphs = {"policy": GraphExport(io, exported, contract, built)}
    return write_bundle(out, graphs, fields, options, _checker(options), force)


def _checker(options: ExportOptions) -> Callable[[Bundle, dict[str, nn.Cell]], dict[str, Any]]:
    return lambda bundle, cells: self_check(bundle, cells, options.check_samples, options.check_seed, localize)


def _fresh(cells: UserCells, built: nn.Cell) -> nn.Cell:
    """A second copy of the user's Cell (to convert to fp16 without touching the caller's object)."""
    if cells.shared:
        try:
            return copy.deepcopy(built)
        except Exception as exc:  # noqa: BLE001
            reason = first_line(exc)
            raise UsageError(f"fp16 export needs a copy of the Cell; pass a factory instead ({reason})") from None
    return cells()


def _contract_or_usage(contract: ContractLike) -> PolicyContract:
    try:
        return as_contract(contract)
    except ContractError as exc:
        raise UsageError(str(exc)) from None


def _probe(cell: nn.Cell, contract: PolicyContract, what: str) -> G.GraphIO:
    try:
        return G.probe_graph(cell, contract)
    except ContractError as exc:
        raise UsageError(f"contract and {what} disagree: {exc}") from None


def _half_precision(cells: UserCells, built: nn.Cell, contract: PolicyContract, io: G.GraphIO) -> nn.Cell:
    """A copy of the Cell with its layers in fp16, compiled once as the export will (graph mode: a layer that
    multiplies its own float32 weights by fp16 inputs passes in PyNative and fails only there). When the Cell's own
    ``construct`` combines its own Parameters with fp16 layer outputs, those Parameters go to fp16 as well."""
    from mindspore import Tensor

    feeds = [Tensor(x) for x in G.examples(contract, 2, np.random.default_rng(2))]
    first = ""
    for own_parameters in (False, True):
        cell = half_precision(_fresh(cells, built), contract, own_parameters)
        try:
            with compat.compile_log_captured(), compat.execution_mode(graph=True):
                cell(*feeds)
            return cell
        except (TypeError, ValueError, RuntimeError) as exc:  # what MindSpore raises for an op's dtypes
            first = first or first_line(exc, 200)
    raise UsageError(f"--precision fp16: the Cell does not run with its layers in fp16 ({first}); export it in fp32")


def _differs_on_rerun(cell: nn.Cell, contract: PolicyContract) -> bool:
    from mindspore import Tensor

    feeds = [Tensor(x) for x in G.examples(contract, 4, np.random.default_rng(1))]
    with compat.execution_mode(graph=False):
        first = [o.asnumpy() for o in compat.as_tuple(cell(*feeds))]
        again = [o.asnumpy() for o in compat.as_tuple(cell(*feeds))]
    return any(not np.array_equal(a, b, equal_nan=True) for a, b in zip(first, again, strict=True))


# -- verify -----------------------------------------------------------------------------------------------
@compat.gc_frozen()
def verify_run(
    bundle: Bundle,
    checkpoint: Path,
    options: VerifyOptions | None = None,
    inputs: Inputs | None = None,
    **kwargs: Any,
) -> VerifyResult:
    """Verify a bundle of our trainer against its checkpoint (the training path rebuilt from ``policy_spec``)."""
    if bundle.policy_spec is None:
        raise UsageError(f"{bundle.root} was exported from a user's Cell: verify it with --cell MODULE:FACTORY")
    options = options or VerifyOptions()
    inputs = inputs or resolve_inputs(bundle)
    cells = TrainerCells(checkpoint, bundle.policy_spec)
    kwargs.setdefault("localizer", CellLocalizer(bundle, cells, options.device))
    return verify(bundle, options, inputs, cells, checkpoint, **kwargs)


@compat.gc_frozen()
def verify_policy(
    cell: CellLike,
    contract: ContractLike | None,
    model: str | Path,
    *,
    checkpoint: str | Path | None = None,
    env_id: str | None = None,
    env: str | Callable[[], Any] | None = None,
    observations: str | Path | np.ndarray | None = None,
    options: VerifyOptions | None = None,
    reference: Reference | None = None,
    progress: Callable[[str], None] = lambda _msg: None,
) -> VerifyResult:
    """Verify a team's own policy: ``cell`` (object, factory or ``MODULE:FACTORY``) is the training path,
    ``model`` an exported MindIR file (exported with plain ``mindspore.export``: then ``contract`` is
    required) or a bundle directory written by ``export_policy``.

    Observations come from ``env_id`` (any registered gymnasium id), ``env`` (a constructor of the team's
    own env, or ``MODULE:FACTORY``), ``observations`` (recorded: ``.npy``/``.npz`` path or an array; then
    episode replay is skipped and the report says so), or the contract's ``env_id``.
    """
    options = options or VerifyOptions()
    compat.select_device(options.device, options.device_id)
    checkpoint = Path(checkpoint) if checkpoint is not None else None  # a path as a string, as the other entry points
    cells = UserCells(cell, checkpoint)
    with cells.caller_mode_kept():
        bundle = open_model(model, contract, cells)
        inputs = resolve_inputs(bundle, env_id, env, observations)
        localizer = CellLocalizer(bundle, cells, options.device)
        return verify(bundle, options, inputs, cells, checkpoint, reference, progress=progress, localizer=localizer)


def open_model(model: str | Path, contract: ContractLike | None, cells: UserCells | None = None) -> Bundle:
    """A bundle directory (or a file inside one), or a bare MindIR wrapped as a one-graph bundle."""
    path = Path(model)
    if not path.exists():
        raise UsageError(f"model not found: {path}")
    bundle_dir = path if path.is_dir() else path.parent
    if (bundle_dir / "manifest.json").is_file():
        try:
            bundle = load_bundle(bundle_dir)
        except BundleError as exc:
            raise UsageError(str(exc)) from None
        if contract is not None:
            check_same_contract(bundle, _contract_or_usage(contract))
        if cells is not None:
            cells.constants = bundle.contract(bundle.graphs[0]).constants
        return bundle
    if path.is_dir() or path.suffix != ".mindir":
        raise UsageError(f"{path} is neither a bundle directory nor a .mindir file")
    if contract is None:
        raise UsageError(f"{path.name} is a bare MindIR: pass --contract CONTRACT.toml to say what its outputs mean")
    return mindir_bundle(path, _contract_or_usage(contract), cells)


def mindir_bundle(path: Path, contract: PolicyContract, cells: UserCells | None) -> Bundle:
    """A user-exported MindIR (no bundle) as a one-graph bundle in memory: its I/O probed from the MindIR itself
    (and checked against the Cell when there is one); ONNX and ``.ms`` are absent, and runtimes that need them
    report why."""
    import mindspore as ms

    if contract.constants:
        raise UsageError(f"{path.name} is a bare MindIR and the contract gives constant inputs "
                         f"({', '.join(c.name for c in contract.constants)}): export a bundle with `export --cell`, "
                         "whose graphs feed them")  # fmt: skip
    try:
        graph_cell = nn.GraphCell(ms.load(str(path)))
    except Exception as exc:  # noqa: BLE001 - MindSpore raises assorted types for unreadable files
        raise UsageError(f"cannot load {path} as MindIR: {first_line(exc)}") from None
    io = _probe(graph_cell, contract, f"the MindIR {path.name}")
    if cells is not None:
        cell_io = _probe(cells(), contract, "the Cell")
        cell_shapes, mindir_shapes = [list(t.shape) for t in cell_io.outputs], [list(t.shape) for t in io.outputs]
        frozen = [t.name for t, c in zip(io.outputs, cell_io.outputs, strict=True)
                  if c.shape[:1] == (-1,) and t.shape[:1] != (-1,)]  # fmt: skip
        if frozen:
            shape = next(list(t.shape) for t in io.outputs if t.name == frozen[0])
            spec = f"Tensor(shape=[None, {', '.join(map(str, contract.obs_shape))}], dtype=mindspore.float32)"
            raise UsageError(f"output {frozen[0]!r} of {path.name} keeps shape {shape} whatever the batch while the "
                             "Cell's follows it: the MindIR was exported at a fixed batch, which froze that shape; "
                             f"export with a dynamic batch, mindspore.export(net, {spec}, ...)")  # fmt: skip
        if cell_shapes != mindir_shapes:
            raise UsageError(f"the Cell's outputs {cell_shapes} are not the MindIR's {mindir_shapes}: "
                             "is the MindIR exported from this Cell?")  # fmt: skip
    reason = "a bare MindIR was given; `export --cell ...` writes a bundle with ONNX and .ms too"
    entry = {"file": path.name, "format": "mindir", "sha256": sha256_file(path)}
    entry["mind_ir_version"] = mindir_version(path)
    manifest = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "env_id": contract.env_id,
        "precision": "fp32",
        "source": {"kind": "mindir", "mindir": str(path.resolve())},
        "exporter": {"mind_ir_version": entry["mind_ir_version"]},
        "graphs": {"policy": {**io.to_dict(), "contract": contract.to_dict(),
                              "files": {"mindir": entry, "onnx": {"skipped": reason}, "ms": {"skipped": reason}}}},
    }  # fmt: skip
    return Bundle(path.parent, manifest)
