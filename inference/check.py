"""``python -m inference.check BUNDLE --golden GOLDEN.npz``: the consistency check on the deploy box.

The training box records a golden file (``verify --save-golden``): the reference's inputs, outputs and seeded
episodes. This box, with no MindSpore, replays them through its own runtimes (the Lite runner built against its
SDK; ONNX Runtime if installed) and compares with the same code, the same report formats (report.json, report.md,
junit.xml, action_diff.png when matplotlib is installed) and the same exit codes as ``verify``: 0 consistent,
1 inconsistent, 2 usage or input error, 3 a required runtime is unavailable, 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inference.bundle import Bundle, BundleError, load_bundle
from inference.compare.checks import VerifyResult
from inference.compare.judge.stats import PRESETS, Tolerance
from inference.compare.verifier import VerifyOptions
from inference.errors import EXIT_CODES, UsageError, run_cli
from inference.lite.emulation import add_arm_cpu, apply_arm_cpu
from inference.report.provenance import invocation

if TYPE_CHECKING:
    from inference.report.writers import ExtraWriter

DEPLOY_SIDE_RUNTIMES = ("lite", "onnxruntime")  # what a golden check runs by default: no MindSpore needed


def parse_tolerance(text: str) -> tuple[str, tuple[float, float]]:
    """``OUTPUT=ATOL,RTOL`` for ``--tol``."""
    try:
        name, values = text.split("=", 1)
        atol, rtol = (float(v) for v in values.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected OUTPUT=ATOL,RTOL, got {text!r}") from None
    if not name or not (atol >= 0 and rtol >= 0):
        raise argparse.ArgumentTypeError(f"expected OUTPUT=ATOL,RTOL with non-negative numbers, got {text!r}")
    return name, (atol, rtol)


def names(text: str | None) -> tuple[str, ...]:
    return tuple(n.strip() for n in (text or "").split(",") if n.strip())


def check_golden(
    bundle: Bundle,
    golden: Path,
    options: VerifyOptions,
    observation_args: dict[str, Any],
    progress: Callable[[str], None] = lambda _msg: None,
) -> VerifyResult:
    """Every selected runtime against the golden file's reference; episodes on the env it was recorded on."""
    from inference.compare.golden import golden_layers, load_golden, read_golden
    from inference.compare.inputs import Inputs, resolve_inputs
    from inference.compare.verifier import verify

    reference = load_golden(golden, bundle)
    localizer = golden_layers(golden, bundle, options.device)
    inputs = Inputs()
    if reference.traces:  # free-running episodes need the env the golden file was recorded on
        given = {k: v for k, v in observation_args.items() if v is not None}
        recorded = read_golden(golden)[0].get("env")
        if not given and isinstance(recorded, str) and ":" in recorded:  # code: run only when named here
            raise UsageError(f"the golden file's episodes ran on {recorded!r}, a team's own env: a golden file never "
                             f"runs code, pass --env {recorded} to run it here (or --env-id ID)")  # fmt: skip
        try:
            inputs = resolve_inputs(bundle, **(given or {"env_id": recorded}))
        except UsageError as exc:
            if given:
                raise
            raise UsageError(f"the golden file's episodes ran on {recorded!r}, which this box cannot recreate ({exc}); "
                             "pass --env MODULE:FACTORY or --env-id ID") from None  # fmt: skip
    result = verify(bundle, options, inputs, reference=reference, progress=progress, localizer=localizer)
    if reference.origin_unchecked:  # an old-style golden file without a manifest hash: say so in the report
        from inference.compare.checks import Check

        result.checks.append(Check("golden", "golden_origin", "warn", reference.origin_unchecked))
    return result


def finish(
    result: VerifyResult, out: Path, against: str, started: float, quiet: bool,
    extra: Mapping[str, ExtraWriter] | None = None,
) -> int:  # fmt: skip
    """Reports into ``out`` (``extra``: more files of the set), the table (unless quiet), one verdict line; returns
    the exit code (0 or 1)."""
    from inference.report.writers import write_reports

    paths = write_reports(result, out, extra)
    if not quiet:
        print(result.console_table())
    verdict = "consistent" if result.ok else result.verdict
    print(f"{verdict}: {against}; reports in {out}/ ({', '.join(p.name for p in paths.values())}); "
          f"{time.perf_counter() - started:.1f} s")  # fmt: skip
    return result.exit_code


def prepare_out(out: Path) -> None:
    """The report directory can be written (checked before any work; created only with the reports)."""
    from inference.report.writers import check_report_dir

    check_report_dir(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m inference.check",
        description=__doc__.splitlines()[0],
        epilog=EXIT_CODES,
    )
    p.add_argument("bundle", type=Path, help="bundle directory")
    p.add_argument("--golden", type=Path, required=True, help="golden file written by verify --save-golden")
    p.add_argument("--out", type=Path, default=Path("reports/check"), help="report directory")
    p.add_argument("--runtimes", default=",".join(DEPLOY_SIDE_RUNTIMES), help="comma-separated runtimes")
    p.add_argument("--require", default="", help="comma-separated runtimes that must be available (else exit 3)")
    p.add_argument("--env-id", help="the env for episodes (default: the one the golden file was recorded on)")
    p.add_argument("--env", metavar="MODULE:FACTORY", help="your own env constructor (gymnasium API)")
    p.add_argument("--device", default="cpu", choices=["cpu", "ascend"], help="device for the Lite runner")
    p.add_argument("--device-id", type=int, default=0)
    p.add_argument(
        "--tolerance",
        choices=sorted(PRESETS),
        help="tolerance preset of every runtime (default: the precision each computes in on this device)",
    )
    p.add_argument("--emulate", choices=["fp16"], help="also run the bundle's graph as a device computing in fp16 "
                   "would (emulated-fp16, on this CPU: needs onnx and onnxruntime)")  # fmt: skip
    p.add_argument("--tol", action="append", type=parse_tolerance, default=[], metavar="OUTPUT=ATOL,RTOL",
                   help="per-output tolerance override, repeatable")  # fmt: skip
    p.add_argument(
        "--localize",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="name the first diverging layer of every runtime (the golden file must record layers: verify "
        "--golden-layers); --no-localize: of none; default: of a runtime failing at the network stage",
    )
    p.add_argument(
        "--isolate",
        action="store_true",
        help="run Lite in the runner process (a watchdog for untrusted models) instead of this one",
    )
    add_arm_cpu(p)
    p.add_argument("--quiet", action="store_true", help="print only the verdict")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.isolate:
        os.environ["MSRL_LITE_ISOLATE"] = "1"
    apply_arm_cpu(args)
    from inference.runtimes.registry import RUNTIMES

    for name in (*names(args.runtimes), *names(args.require)):
        if name not in RUNTIMES:
            raise UsageError(f"unknown runtime {name!r}; choose from {', '.join(RUNTIMES)}")
    if not args.golden.is_file():
        raise UsageError(f"golden file not found: {args.golden}")
    prepare_out(args.out)
    try:
        bundle = load_bundle(args.bundle)
    except BundleError as exc:
        raise UsageError(str(exc)) from None
    options = VerifyOptions(
        tolerance=args.tolerance,
        overrides={name: Tolerance(*vals) for name, vals in args.tol},
        runtimes=names(args.runtimes),
        required=names(args.require),
        device=args.device,
        device_id=args.device_id,
        localize={None: "auto", True: "always", False: "never"}[args.localize],
        emulate=args.emulate,
    )
    started = time.perf_counter()
    if not args.quiet:
        print(f"checking {bundle.root} against {args.golden} ...", file=sys.stderr, flush=True)
    progress = (lambda _m: None) if args.quiet else (lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    result = check_golden(bundle, args.golden, options, {"env_id": args.env_id, "env": args.env}, progress)
    result.command = invocation("inference.check", argv)
    return finish(result, args.out, f"{bundle.root} vs golden {args.golden.name}", started, args.quiet)


def cli() -> None:
    """The ``msrl-check`` console script: errors become one line and an exit code, as with ``-m``."""
    run_cli(main)


if __name__ == "__main__":
    cli()
