"""``python -m msrl_consistency.export``: write a deployable bundle and check it against its Cell.

* a run of ours: ``--ckpt RUN_DIR/checkpoint.ckpt [--out BUNDLE_DIR]``;
* your own policy Cell: ``--cell MODULE:FACTORY --ckpt CKPT --contract CONTRACT.toml --out BUNDLE_DIR``
  [``--env ID|MODULE:FACTORY``: the env it acts in, whose spaces the contract is checked against].

Writes MindIR (dynamic batch), ONNX and MindSpore Lite ``.ms`` graphs plus ``manifest.json`` (hashes, shapes,
versions, seeds, the policy contract), after running each graph against the Cell. Exit codes: 0 ok,
1 a format could not be produced or failed its check against the Cell (the others are written, the failed one
marked in the manifest; nothing is written when no format of a graph passed), 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from inference.errors import UsageError, run_cli
from msrl_consistency.artifacts import run_dir as rd

if TYPE_CHECKING:
    from inference.bundle import Bundle
    from msrl_consistency.artifacts.bundle import ExportOptions


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m msrl_consistency.export",
        description=__doc__.split("\n", 1)[1].strip().replace("``", ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes: 0 ok, 1 a format failed (the rest is written, the failure marked in the manifest), "
        "2 usage/input error",
    )
    p.add_argument("--ckpt", type=Path, help="a training run directory (or its checkpoint.ckpt), or your Cell's .ckpt")
    p.add_argument("--cell", metavar="MODULE:FACTORY", help="your policy Cell: FACTORY() returns it (MODULE "
                   "importable from the current directory); needs --contract")  # fmt: skip
    p.add_argument("--contract", type=Path, help="policy contract TOML for --cell (see examples/bring-your-own/)")
    p.add_argument("--env", metavar="ID|MODULE:FACTORY", help="with --cell: the env the policy acts in, a registered "
                   "gymnasium id or your own constructor (default: the contract's env_id); the contract is checked "
                   "against its spaces")  # fmt: skip
    p.add_argument("--out", type=Path, help="bundle directory (default bundles/<run dir name>)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16"], help="graph precision")
    p.add_argument(
        "--target",
        default="cpu",
        choices=["cpu", "ascend310", "ascend310p", "ascend910b"],
        help="the device the bundle is for; its Lite converter configuration is written into the bundle",
    )
    p.add_argument("--precision-mode", metavar="MODE",
                   help="Lite's Ascend precision mode, required for an Ascend target (Lite's default, enforce_fp16, "
                   "computes a float32 graph in fp16): enforce_origin, enforce_fp32, preferred_fp32, "
                   "preferred_optimal or enforce_fp16")  # fmt: skip
    p.add_argument("--formats", default="mindir,onnx,ms", help="comma-separated subset of mindir,onnx,ms")
    p.add_argument("--check-samples", type=int, default=256, help="observations for the self-check (>= 16)")
    p.add_argument("--seed", type=int, default=0, help="seed of the self-check observations")
    p.add_argument("--require-lite", action="store_true", help="fail if the .ms cannot be produced")
    p.add_argument("--force", action="store_true", help="replace an existing bundle directory")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from msrl_consistency import compat  # noqa: F401 - first: MindSpore's import, held safe from Ctrl-C there
    from msrl_consistency.artifacts.bundle import ExportCheckFailed, ExportOptions, describe

    options = ExportOptions(
        precision=args.precision,
        formats=tuple(f.strip() for f in args.formats.split(",") if f.strip()),
        check_samples=args.check_samples,
        check_seed=args.seed,
        require_lite=args.require_lite,
        target=args.target,
        precision_mode=args.precision_mode,
    )
    options.validate()  # every argument checked before any work
    if args.cell is None and args.ckpt is None:
        raise UsageError("pass --ckpt RUN/checkpoint.ckpt, or --cell MODULE:FACTORY --contract C.toml [--ckpt CKPT]")
    if args.ckpt is not None:
        args.ckpt = rd.checkpoint_path(args.ckpt)
    if args.contract is not None and not args.contract.is_file():
        raise UsageError(f"file not found: {args.contract}")
    try:
        bundle = _export(args, options)
    except ExportCheckFailed as exc:  # export's verdict: exit 1 with the failure
        if exc.bundle is not None:  # written, with the format that failed marked: show what is there
            print(describe(exc.bundle))
            _warn_fp16(exc.bundle)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(describe(bundle))
    _warn_fp16(bundle)
    return 0


def _warn_fp16(bundle: Bundle) -> None:
    warning = fp16_warning(bundle)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)


def fp16_warning(bundle: Bundle) -> str | None:
    """The one line export says when the target computes this float32 bundle in fp16 and fp16 breaks it (the
    self-check's emulation): the layer, and the command that keeps it in fp32."""
    emulated = bundle.manifest["self_check"].get("fp16_emulation") or {}
    if emulated.get("passed") is not False:
        return None
    target = bundle.target
    return (f"target {target['device']} ({target['precision_mode']}) computes this float32 bundle in fp16, and fp16 "
            f"breaks it: {emulated['reason']}; keep the layer in fp32: python -m msrl_consistency.precision --bundle "
            f"{bundle.root} --lower fp16 --out PLAN (or export --precision-mode enforce_origin)")  # fmt: skip


def _export(args: argparse.Namespace, options: ExportOptions) -> Bundle:
    from msrl_consistency import api

    if args.cell is not None:
        if args.contract is None:
            raise UsageError("--cell needs --contract CONTRACT.toml: what the Cell's outputs mean")
        if args.out is None:
            raise UsageError("--cell needs --out BUNDLE_DIR")
        bundle = api.export_policy(args.cell, args.contract, args.out, args.ckpt, options, force=args.force,
                                   env=args.env)  # fmt: skip
    else:
        if args.contract is not None:
            raise UsageError("--contract describes your own Cell: pass it with --cell (runs of ours carry theirs)")
        if args.env is not None:
            raise UsageError("--env is for --cell: a run of ours records the env it was trained in")
        out = args.out or Path("bundles") / args.ckpt.resolve().parent.name
        bundle = api.export_run(args.ckpt, out, options, force=args.force)
    return bundle


if __name__ == "__main__":
    run_cli(main)
