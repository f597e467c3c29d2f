"""``python -m msrl_consistency.verify --mindir BUNDLE/policy.mindir --ckpt RUN/checkpoint.ckpt``.

Replays seeded observations and seeded episodes through the training path and every available
inference runtime, writes report.json / report.md / junit.xml / action_diff.png, and exits
0 consistent, 1 inconsistent, 2 usage or input error, 3 a required runtime is unavailable.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from msrl_consistency.errors import UsageError, run_cli


def _tolerance_override(text: str) -> tuple[str, tuple[float, float]]:
    try:
        name, values = text.split("=", 1)
        atol, rtol = (float(v) for v in values.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected OUTPUT=ATOL,RTOL, got {text!r}") from None
    return name, (atol, rtol)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m msrl_consistency.verify",
        description="Prove that every inference runtime acts exactly like the training path.",
        epilog="exit codes: 0 consistent, 1 inconsistent, 2 usage/input error, 3 required runtime unavailable",
    )
    p.add_argument("--mindir", type=Path, help="policy.mindir inside an exported bundle (or use --bundle)")
    p.add_argument("--bundle", type=Path, help="bundle directory")
    p.add_argument("--ckpt", type=Path, help="training checkpoint (default: the one the manifest names)")
    p.add_argument("--runtimes", help="comma-separated runtimes to compare (default: all available)")
    p.add_argument("--require", default="", help="comma-separated runtimes that must be available (else exit 3)")
    p.add_argument("--observations", type=int, default=10_000, help="seeded observations to replay")
    p.add_argument("--episodes", type=int, default=20, help="seeded episodes per mode")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=["cpu", "gpu", "ascend"], help="device for every runtime")
    p.add_argument("--device-id", type=int, default=0)
    p.add_argument("--tolerance", choices=["fp32", "fp16"], help="tolerance preset (default: bundle precision)")
    p.add_argument("--tol", action="append", type=_tolerance_override, default=[], metavar="OUTPUT=ATOL,RTOL",
                   help="per-output tolerance override, repeatable")  # fmt: skip
    p.add_argument("--baseline", type=Path, help="compare metrics to a stored baseline")
    p.add_argument("--save-baseline", type=Path, help="store this run's metrics as a baseline")
    p.add_argument("--save-golden", type=Path, help="record inputs, reference outputs and episode traces (.npz)")
    p.add_argument("--golden", type=Path, help="compare runtimes against a golden file instead of the checkpoint")
    p.add_argument("--out", type=Path, default=Path("reports/verify"), help="report directory")
    p.add_argument("--quiet", action="store_true", help="print only the verdict")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from inference.bundle import BundleError, load_bundle
    from msrl_consistency.compare.stats import Tolerance
    from msrl_consistency.compare.verifier import VerifyOptions, load_golden, save_golden, verify
    from msrl_consistency.report.baseline import check_baseline, save_baseline
    from msrl_consistency.report.writers import console_table, write_reports

    location = args.bundle or args.mindir
    if location is None:
        raise UsageError("pass --mindir BUNDLE/policy.mindir or --bundle BUNDLE")
    if args.mindir is not None and not args.mindir.exists():
        raise UsageError(f"MindIR file not found: {args.mindir}")
    if args.observations < 16 or args.episodes < 1:
        raise UsageError("--observations must be >= 16 and --episodes >= 1")
    try:
        bundle = load_bundle(location)
    except BundleError as exc:
        raise UsageError(str(exc)) from None
    options = VerifyOptions(
        observations=args.observations,
        episodes=args.episodes,
        seed=args.seed,
        tolerance=args.tolerance,
        overrides={name: Tolerance(*vals) for name, vals in args.tol},
        runtimes=[r.strip() for r in args.runtimes.split(",")] if args.runtimes else None,
        required=[r.strip() for r in args.require.split(",") if r.strip()],
        device=args.device,
        device_id=args.device_id,
    )
    start = time.perf_counter()
    reference = None
    checkpoint = args.ckpt
    if args.golden:
        reference = load_golden(args.golden, bundle, options)
        if options.runtimes is None:
            options.runtimes = ["lite", "onnxruntime"]
    elif checkpoint is None:
        checkpoint = Path(bundle.manifest["source"]["checkpoint"])
        if not checkpoint.is_file():
            raise UsageError(f"pass --ckpt: the manifest's checkpoint {checkpoint} does not exist here")
    if checkpoint is not None and not checkpoint.is_file():
        raise UsageError(f"checkpoint not found: {checkpoint}")
    if not args.quiet:
        print(f"verifying {bundle.root} ({bundle.env_id}) against {args.golden or checkpoint} ...", file=sys.stderr)

    def progress(message: str) -> None:
        if not args.quiet:
            print(f"  {message}", file=sys.stderr, flush=True)

    result = verify(bundle, checkpoint, options, reference=reference, progress=progress)
    if args.baseline:
        result.checks.append(check_baseline(args.baseline, result))
    if args.save_baseline:
        save_baseline(args.save_baseline, result)
    if args.save_golden:
        save_golden(args.save_golden, result)
    paths = write_reports(result, args.out)
    elapsed = time.perf_counter() - start
    if not args.quiet:
        print(console_table(result))
    verdict = "consistent" if result.exit_code == 0 else "INCONSISTENT"
    print(f"{verdict}: reports in {args.out}/ ({', '.join(p.name for p in paths.values())}); {elapsed:.1f} s")
    return result.exit_code


if __name__ == "__main__":
    run_cli(main)
