"""``python -m msrl_consistency.verify``: prove every inference runtime acts like the training path.

Three ways in:

* a run of ours: ``--mindir BUNDLE/policy.mindir --ckpt RUN/checkpoint.ckpt``;
* a bundle exported from your own Cell: ``--bundle BUNDLE --cell MODULE:FACTORY --ckpt CKPT`` (the bundle names
  its Cell's factory, but only ``--cell`` or ``--trust-bundle-cell`` lets code run);
* a MindIR you exported yourself: ``--mindir USER.mindir --cell MODULE:FACTORY --ckpt CKPT --contract C.toml``.

Observations come from ``--env-id`` / ``--env MODULE:FACTORY`` (seeded episodes) or ``--observations-file``
(recorded; episode replay is then skipped), or from the env the bundle or contract names. Writes report.json,
report.md, junit.xml and action_diff.png, and exits 0 consistent, 1 inconsistent, 2 usage or input error,
3 a required runtime is unavailable.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import msrl_consistency.runtimes  # noqa: F401 - registers the MindSpore runtimes with inference.runtimes
from inference.check import (
    DEPLOY_SIDE_RUNTIMES,
    check_golden,
    finish,
    names,
    parse_tolerance,
    prepare_out,
)
from inference.errors import EXIT_CODES, UsageError, run_cli
from inference.lite.emulation import add_arm_cpu, apply_arm_cpu
from inference.report.provenance import invocation
from msrl_consistency.artifacts import run_dir as rd
from msrl_consistency.fleet.command import add_fleet_args, check_fleet_args

if TYPE_CHECKING:
    from inference.bundle import Bundle
    from inference.compare.audit import AuditFacts
    from inference.compare.checks import VerifyResult
    from inference.compare.verifier import VerifyOptions
    from msrl_consistency.artifacts.cells import UserCells
    from msrl_consistency.localization import CellLocalizer


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m msrl_consistency.verify",
        description=__doc__.split("\n", 1)[1].strip().replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=EXIT_CODES,
    )
    model = p.add_argument_group("what to verify")
    model.add_argument("--mindir", type=Path, help="a .mindir: inside a bundle, or exported by you (with --contract)")
    model.add_argument("--bundle", type=Path, help="bundle directory")
    model.add_argument(
        "--ckpt", type=Path, help="the training path's checkpoint, or the run dir holding it (default: the manifest's)"
    )
    model.add_argument("--cell", metavar="MODULE:FACTORY", help="your policy Cell: FACTORY() returns it (MODULE "
                       "importable from the current directory)")  # fmt: skip
    model.add_argument("--contract", type=Path, help="policy contract TOML (needed for a MindIR outside a bundle)")
    model.add_argument("--trust-bundle-cell", action="store_true", help="import and run the MODULE:FACTORY the "
                       "bundle's manifest names (otherwise only --cell chooses the code that runs)")  # fmt: skip
    inputs = p.add_argument_group("observations (one source; default: the env the bundle or contract names)")
    inputs.add_argument("--env-id", help="any registered gymnasium id")
    inputs.add_argument("--env", metavar="MODULE:FACTORY", help="your own env constructor (gymnasium API)")
    inputs.add_argument("--observations-file", type=Path, help="recorded observations, .npy or .npz [N, *obs]")
    p.add_argument("--runtimes", help="comma-separated runtimes to compare (default: all available)")
    p.add_argument("--require", default="", help="comma-separated runtimes that must be available (else exit 3)")
    p.add_argument("--observations", type=int, default=10_000, help="seeded observations to replay")
    p.add_argument("--episodes", type=int, default=20, help="seeded episodes per mode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=["cpu", "gpu", "ascend"], help="device for every runtime")
    p.add_argument("--device-id", type=int, default=0)
    add_arm_cpu(p)
    p.add_argument("--tolerance", choices=["fp32", "fp16"],
                   help="tolerance preset of every runtime (default: the precision each computes in, from the bundle's "
                   "target and plan; what each promises: README)")  # fmt: skip
    p.add_argument("--emulate", choices=["fp16"],
                   help="also run the bundle's graph as a device computing in fp16 would (runtime emulated-fp16: every "
                   "operator's inputs, weights and outputs rounded to fp16, matrix products accumulated in fp32), with "
                   "every check and the first diverging layer; an emulation on this CPU")  # fmt: skip
    p.add_argument("--tol", action="append", type=parse_tolerance, default=[], metavar="OUTPUT=ATOL,RTOL",
                   help="per-output tolerance override, repeatable")  # fmt: skip
    p.add_argument("--baseline", type=Path, help="compare metrics to a stored baseline")
    p.add_argument("--save-baseline", type=Path, help="store this run's metrics as a baseline")
    p.add_argument("--save-golden", type=Path, help="record inputs, reference outputs and episode traces (.npz)")
    p.add_argument("--golden", type=Path, help="compare runtimes against a golden file instead of the training path")
    p.add_argument("--out", type=Path, default=Path("reports/verify"), help="report directory")
    p.add_argument("--localize", action=argparse.BooleanOptionalAction, default=None,
                   help="name the first diverging layer of every runtime compared (--no-localize: of none; default: "
                   "of a runtime failing at the network, precision or version stage)")  # fmt: skip
    p.add_argument("--golden-layers", action="store_true",
                   help="with --save-golden: record every layer's reference outputs too, so a deploy box without "
                   "MindSpore can name the diverging layer (inference.check)")  # fmt: skip
    p.add_argument("--audit", type=Path, nargs="+", metavar="RECORDING",
                   help="audit what a device recorded (inference.field: play --record, inference.load(record=)) "
                   "against the training path, instead of seeded observations; with --bundle")  # fmt: skip
    p.add_argument("--audit-windows", type=int, default=10, help="time windows an audit reports the error in")
    add_fleet_args(p)
    p.add_argument("--quiet", action="store_true", help="print only the verdict")
    return p


def _check_args(args: argparse.Namespace) -> None:
    """Everything that can be wrong with the arguments alone, before any work."""
    from inference.runtimes.registry import RUNTIMES

    if (args.bundle is None) == (args.mindir is None):
        raise UsageError("pass exactly one of --mindir FILE.mindir or --bundle BUNDLE")
    location = args.bundle or args.mindir
    if not location.exists():
        raise UsageError(f"{'bundle' if args.bundle else 'MindIR file'} not found: {location}")
    if args.observations < 16 or args.episodes < 1:
        raise UsageError("--observations must be >= 16 and --episodes >= 1")
    for name in (*names(args.runtimes), *names(args.require)):
        if name not in RUNTIMES:
            raise UsageError(f"unknown runtime {name!r}; choose from {', '.join(RUNTIMES)}")
    if args.golden and (args.cell or args.ckpt):
        raise UsageError("--golden replaces the training path: drop --cell/--ckpt")
    if args.golden_layers and (not args.save_golden or args.golden):
        raise UsageError("--golden-layers records layer outputs into --save-golden (from the training path)")
    if args.audit and (args.golden or args.save_golden or args.bundle is None):
        raise UsageError("--audit compares a recording with the training path of a --bundle (no golden files)")
    check_fleet_args(args)
    if args.audit_windows < 1:
        raise UsageError(f"--audit-windows must be >= 1, got {args.audit_windows}")
    if args.ckpt is not None:
        args.ckpt = rd.checkpoint_path(args.ckpt)
    for path in (args.contract, args.golden, args.baseline, args.observations_file):
        if path is not None and not path.is_file():
            raise UsageError(f"file not found: {path}")
    if args.fleet is None:
        prepare_out(args.out)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _check_args(args)
    apply_arm_cpu(args)
    from inference.compare.judge.stats import Tolerance
    from inference.compare.verifier import VerifyOptions
    from inference.report.baseline import check_baseline, read_baseline, save_baseline

    baseline = read_baseline(args.baseline) if args.baseline else None  # before minutes of comparisons

    options = VerifyOptions(
        observations=args.observations,
        episodes=args.episodes,
        seed=args.seed,
        tolerance=args.tolerance,
        overrides={name: Tolerance(*vals) for name, vals in args.tol},
        runtimes=names(args.runtimes) or (DEPLOY_SIDE_RUNTIMES if args.golden else None),
        required=names(args.require),
        device=args.device,
        device_id=args.device_id,
        localize={None: "auto", True: "always", False: "never"}[args.localize],
        emulate=args.emulate,
    )

    def progress(message: str) -> None:
        if not args.quiet:
            print(f"  {message}", file=sys.stderr, flush=True)

    if args.fleet is not None:
        with _gc_frozen_unless_golden(args):
            return _fleet(args, options, progress, argv)
    start = time.perf_counter()
    with _gc_frozen_unless_golden(args):
        result, against, localizer, facts = _run(args, options, progress)
    if args.baseline:
        result.checks.append(check_baseline(args.baseline, result, baseline))
    if args.save_baseline:
        save_baseline(args.save_baseline, result)
    if args.save_golden:
        from inference.compare.golden import save_golden

        layers = localizer.record(result.reference.feeds) if args.golden_layers and localizer else None
        save_golden(args.save_golden, result.reference, result.bundle, result.inputs.get("env"), layers)
    result.command = invocation("msrl_consistency.verify", argv)
    extra = None
    if facts is not None:
        from msrl_consistency.audit import audit_files

        extra = audit_files(facts)
    return finish(result, args.out, against, start, args.quiet, extra)


def _gc_frozen_unless_golden(args: argparse.Namespace) -> contextlib.AbstractContextManager[None]:
    """``compat.gc_frozen`` (MindSpore collects garbage before each of a verify's ~30 compiles), except for the deploy
    side's ``--golden`` check, which compiles nothing and must not import MindSpore."""
    if args.golden:
        return contextlib.nullcontext()
    from msrl_consistency import compat

    return compat.gc_frozen()


def _run(
    args: argparse.Namespace, options: VerifyOptions, progress: Callable[[str], None]
) -> tuple[VerifyResult, str, CellLocalizer | None, AuditFacts | None]:
    """Resolve the model, the training path and the observations; run verify (or the audit). Returns the result,
    a description, the localizer (the training path's Cells; None for a golden check or an audit) and the audit's
    facts."""
    from inference.compare.inputs import resolve_inputs
    from inference.compare.verifier import verify
    from msrl_consistency import envs  # noqa: F401 - registers our own env ids with gymnasium, where inputs look

    say = _say(args)
    observation_args = {"env_id": args.env_id, "env": args.env, "observations": args.observations_file}
    if args.golden:  # no --cell (``_check_args``): the bundle against the golden file, no MindSpore
        bundle = _bundle(args)
        say(f"verifying {bundle.root} against {args.golden} ...")
        result = check_golden(bundle, args.golden, options, observation_args, progress)
        return result, f"golden {args.golden.name}", None, None
    bundle, cells, checkpoint = _model_and_reference(args, say)
    if args.cell:
        model, against = args.bundle or args.mindir, args.cell
    else:
        model, against = bundle.root, checkpoint or (bundle.manifest.get("source") or {}).get("cell")
    described = f"{model} vs {against}"
    if args.audit:
        result, facts = _audit(args, bundle, cells, checkpoint, options, progress)
        return result, described, None, facts
    inputs = resolve_inputs(bundle, **observation_args)
    say(f"verifying {model} on {inputs.label} against {against} ...")
    localizer = _localizer(bundle, cells, options)
    result = verify(bundle, options, inputs, cells, checkpoint, progress=progress, localizer=localizer)
    return result, described, localizer, None


def _fleet(args: argparse.Namespace, options: VerifyOptions, progress: Callable[[str], None],
           argv: list[str] | None) -> int:  # fmt: skip
    """--fleet: every device's recording audited (``msrl_consistency.fleet``)."""
    from msrl_consistency.fleet.command import run_fleet

    if args.ckpt is not None:
        args.ckpt = args.ckpt.resolve()  # the workers of a Ray cluster load it by this path
    bundle, cells, checkpoint = _model_and_reference(args, _say(args))
    return run_fleet(args, bundle, cells, checkpoint, options, progress, invocation("msrl_consistency.verify", argv))


def _say(args: argparse.Namespace) -> Callable[[str], None]:
    return (lambda m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))


def _model_and_reference(args: argparse.Namespace, say: Callable[[str], None]) -> tuple[Bundle, object, Path | None]:
    """The bundle, the training path's Cells and its checkpoint (``--cell``: the user's; else the bundle's), on the
    device chosen before the first kernel (the Cell probe) runs."""
    from msrl_consistency import compat

    compat.select_device(args.device, args.device_id)
    if args.cell:
        return _user_model(args, say)
    bundle = _bundle(args)
    return bundle, *_bundle_reference(args, bundle, say)


def _user_model(args: argparse.Namespace, say: Callable[[str], None]) -> tuple[Bundle, UserCells, Path | None]:
    """--cell: the model (a bundle or a bare MindIR with --contract) and the user's Cell factory as reference."""
    from msrl_consistency import api

    location = args.bundle or args.mindir
    checkpoint = args.ckpt
    if checkpoint is None and ((location if location.is_dir() else location.parent) / "manifest.json").is_file():
        checkpoint = _manifest_checkpoint(api.open_model(location, args.contract).manifest.get("source") or {}, say)
    cells = _user_cells(args.cell, checkpoint)
    bundle = api.open_model(location, args.contract, cells)
    recorded = (bundle.manifest.get("source") or {}).get("cell")
    if recorded and ":" in recorded and recorded != args.cell:
        say(f"note: the bundle was exported from {recorded}; verifying against --cell {args.cell} as asked")
    return bundle, cells, checkpoint


def _bundle(args: argparse.Namespace) -> Bundle:
    """The bundle named by --bundle or --mindir (which must sit in one), checked against --contract if given."""
    from inference.bundle import BundleError, load_bundle
    from inference.bundle.contract import PolicyContract
    from inference.compare.inputs import check_same_contract

    try:
        bundle = load_bundle(args.bundle or args.mindir)
    except BundleError as exc:
        if args.mindir is not None and not (args.mindir.parent / "manifest.json").exists():
            raise UsageError(f"{args.mindir} is not in a bundle: pass --cell MODULE:FACTORY --ckpt CKPT --contract "
                             "CONTRACT.toml to verify a MindIR you exported yourself") from None  # fmt: skip
        raise UsageError(str(exc)) from None
    if args.contract is not None:
        check_same_contract(bundle, PolicyContract.from_toml(args.contract))
    return bundle


def _bundle_reference(
    args: argparse.Namespace, bundle: Bundle, say: Callable[[str], None]
) -> tuple[object, Path | None]:
    """The training path a bundle names: the trainer's checkpoint, or (trusted on request) the exporting Cell."""
    source = bundle.manifest.get("source") or {}
    checkpoint = args.ckpt or _manifest_checkpoint(source, say)
    if source.get("kind") == "cell":
        if not args.trust_bundle_cell:
            raise UsageError(f"the bundle was exported from {source.get('cell')!r}: pass --cell {source.get('cell')} "
                             "to run that code (or --trust-bundle-cell to let the manifest choose it)")  # fmt: skip
        return _user_cells(source["cell"], checkpoint), checkpoint
    if checkpoint is None:
        raise UsageError("pass --ckpt RUN/checkpoint.ckpt (the training path to compare with)")
    _same_env(bundle, checkpoint)
    from msrl_consistency.artifacts.cells import TrainerCells

    return TrainerCells(checkpoint, bundle.policy_spec or {}), checkpoint


def _audit(
    args: argparse.Namespace, bundle: Bundle, cells: object, checkpoint: Path | None, options: VerifyOptions,
    progress: Callable[[str], None],
) -> tuple[VerifyResult, AuditFacts]:  # fmt: skip
    from msrl_consistency.audit import audit_recordings

    return audit_recordings(bundle, args.audit, cells, checkpoint, device=options.device, windows=args.audit_windows,
                            tolerance=options.tolerance, overrides=options.overrides, localize=options.localize,
                            progress=progress)  # fmt: skip


def _localizer(bundle: Bundle, cells: object, options: VerifyOptions) -> CellLocalizer:
    from msrl_consistency.localization import CellLocalizer

    return CellLocalizer(bundle, cells, options.device)


def _manifest_checkpoint(source: dict, say: Callable[[str], None]) -> Path | None:
    """The checkpoint the manifest names, used only when it is here and is the very file the bundle was exported
    from (its sha256 matches): a path from another machine is a hint, never trusted."""
    from inference.bundle import sha256_file

    if not source.get("checkpoint"):
        return None
    path = Path(source["checkpoint"])
    if not path.is_file():
        raise UsageError(f"pass --ckpt: the manifest's checkpoint {path} does not exist here")
    if sha256_file(path) != source.get("checkpoint_sha256"):
        raise UsageError(f"pass --ckpt: {path} (named by the manifest) is not the checkpoint the bundle was exported "
                         "from (sha256 differs)")  # fmt: skip
    say(f"using the checkpoint the manifest names, {path} (sha256 matches)")
    return path


def _user_cells(factory: str, checkpoint: Path | None) -> UserCells:
    from msrl_consistency.artifacts.cells import UserCells

    return UserCells(factory, checkpoint)


def _same_env(bundle: Bundle, checkpoint: Path) -> None:
    """A checkpoint of a run on another env would fail its strict load with a list of missing names; say why."""
    from msrl_consistency.artifacts import run_dir as rd

    try:
        run_env = rd.read_run_json(checkpoint.parent).get("env_id")
    except UsageError:
        return  # a checkpoint outside a run dir: the strict load still guards it
    if run_env and bundle.env_id and run_env != bundle.env_id:
        raise UsageError(f"checkpoint {checkpoint} was trained on {run_env}; the bundle {bundle.root} is for "
                         f"{bundle.env_id}")  # fmt: skip


if __name__ == "__main__":
    run_cli(main)
