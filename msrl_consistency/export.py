"""``python -m msrl_consistency.export --ckpt RUN_DIR/checkpoint.ckpt --out BUNDLE_DIR``.

Writes MindIR, ONNX and MindSpore Lite ``.ms`` graphs (deterministic and sampling) plus
``manifest.json``, after checking each graph against the Cell. Exit codes: 0 ok, 1 self-check failed
(no bundle written), 2 bad input.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from msrl_consistency.errors import run_cli


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m msrl_consistency.export", description=__doc__.splitlines()[0])
    p.add_argument("--ckpt", required=True, type=Path, help="checkpoint.ckpt inside a training run directory")
    p.add_argument("--out", type=Path, help="bundle directory (default bundles/<run dir name>)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "fp16"], help="graph precision")
    p.add_argument("--formats", default="mindir,onnx,ms", help="comma-separated subset of mindir,onnx,ms")
    p.add_argument("--check-samples", type=int, default=256, help="observations for the self-check")
    p.add_argument("--seed", type=int, default=0, help="seed of the self-check observations")
    p.add_argument("--require-lite", action="store_true", help="fail if the .ms cannot be produced")
    p.add_argument("--force", action="store_true", help="replace an existing bundle directory")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from msrl_consistency.artifacts.bundle import ExportOptions, describe, export_bundle

    out = args.out or Path("bundles") / args.ckpt.resolve().parent.name
    options = ExportOptions(
        precision=args.precision,
        formats=tuple(f.strip() for f in args.formats.split(",") if f.strip()),
        check_samples=args.check_samples,
        check_seed=args.seed,
        require_lite=args.require_lite,
    )
    bundle = export_bundle(args.ckpt, out, options, force=args.force)
    print(describe(bundle))
    return 0


if __name__ == "__main__":
    run_cli(main)
