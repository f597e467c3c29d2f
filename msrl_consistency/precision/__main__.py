"""``python -m msrl_consistency.precision``: a precision plan, the cheapest set of layers kept in fp32 while the rest
runs in fp16 or int8, judged in policy terms, and a bundle whose ``.ms`` follows it.

    python -m msrl_consistency.precision --bundle B --ckpt RUN --lower int8 --out PLAN
    python -m msrl_consistency.precision --bundle B --cell policy:make_policy --ckpt C --lower fp16 --out PLAN

Every candidate is judged by verify itself: its bundle's lowered runtime (Lite's quantized kernels for int8, the fp16
emulation for fp16) against verify's reference, with verify's checks and the verifier's bar for that precision, on
the observations and seeded episodes verify plays with the same --observations, --episodes and --seed. So a plan the
search accepts is a bundle verify passes, and a candidate verify fails is one the search rejects. Each layer's
sensitivity alone (that layer lowered, the rest fp32) ranks the layers; then the cheapest set of kept layers that
passes (any set; see ``search``), and the plan's bundle: fp16 through Lite's mixed-precision execution plan, int8
through Lite's quantization (full, ``skip_quant_node`` for kept layers, calibrated on observations the policy really
saw in episodes verify never plays, or a field recording; or weight). ``plan.md`` and the manifest's ``plan`` say
what was measured. ``--keep`` writes the bundle of a given set instead of searching (``--keep none``: every layer
lowered).

Exit codes: 0 a plan verify passes was written (or the ``--keep`` set passes); 1 the bundle was written but verify
fails it (``--keep``, or no set passes, not even every layer in fp32); 2 bad input (and nothing to lower); 3 the
lowering cannot run here (no converter, no onnx, a .ms Lite cannot load).
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from inference.errors import EXIT_CODES, UsageError, run_cli


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m msrl_consistency.precision", epilog=EXIT_CODES,
                                description=__doc__.split("\n", 1)[1].split("\n\n", 2)[2].strip(),
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--bundle", type=Path, required=True, help="a float32 bundle with its .onnx graphs")
    p.add_argument("--ckpt", type=Path, help="the training run (or checkpoint) the bundle was exported from")
    p.add_argument("--cell", metavar="MODULE:FACTORY", help="your policy Cell (a bundle exported with --cell)")
    p.add_argument("--lower", required=True, choices=["fp16", "int8"], help="the precision of the lowered layers")
    p.add_argument(
        "--quantization",
        default="full",
        choices=["full", "weight"],
        help="int8: Lite's full quantization (weights and activations, calibrated) or weight quantization",
    )
    p.add_argument("--out", type=Path, required=True, help="the plan's bundle directory")
    p.add_argument("--keep", help="comma-separated layers to keep in fp32 instead of searching ('none': lower all)")
    p.add_argument("--recording", type=Path, nargs="+", metavar="DIR",
                   help="a field recording (inference.load(record=)) whose observations calibrate and evaluate the "
                   "plan, instead of states visited in seeded episodes")  # fmt: skip
    p.add_argument(
        "--observations",
        type=int,
        default=10_000,
        help="observations each candidate is judged on, as verify's --observations (default 10000)",
    )
    p.add_argument(
        "--episodes",
        type=int,
        default=20,
        help="seeded episodes per mode each candidate plays, as verify's --episodes (default 20)",
    )
    p.add_argument("--seed", type=int, default=0, help="verify's --seed the candidates are judged with (default 0)")
    p.add_argument("--max-evaluations", type=int, default=64, help="candidates evaluated at most (default 64)")
    p.add_argument("--env-id", help="the env to play episodes in (default: the bundle's)")
    p.add_argument("--env", metavar="MODULE:FACTORY", help="your own env constructor (gymnasium API)")
    p.add_argument("--force", action="store_true", help="replace an existing --out directory")
    p.add_argument("--quiet", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from msrl_consistency import compat  # noqa: F401 - first: MindSpore's import, held safe from Ctrl-C there
    from msrl_consistency.precision.plan import make_plan

    if args.observations < 64 or args.episodes < 1 or args.max_evaluations < 1:
        raise UsageError("--observations must be >= 64, --episodes and --max-evaluations >= 1")
    say = (lambda _m: None) if args.quiet else (lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    with tempfile.TemporaryDirectory(prefix="msrl-plan-") as work:
        bundle, result, plan = make_plan(args, Path(work), say)
    print(summary(bundle, plan, args))
    if not result.final.ok and args.keep is None:  # every layer kept is the float32 graph: too few states to bound it
        print(f"error: no set of kept layers passes verify, not even every layer in fp32, on "
              f"{plan['judge']['observations']} observations: {'; '.join(result.final.broken)[:400]}",
              file=sys.stderr)  # fmt: skip
    return 0 if result.final.ok else 1


def verify_command(bundle: Any, plan: dict[str, Any], args: Any) -> str:
    """The verify command that judges the plan's bundle as the search did: the same Cell, checkpoint and options."""
    j = plan["judge"]
    parts = ["python -m msrl_consistency.verify", "--bundle", shlex.quote(str(bundle.root))]
    for flag, value in (("--cell", args.cell), ("--ckpt", args.ckpt), ("--env-id", args.env_id), ("--env", args.env)):
        if value is not None:
            parts += [flag, shlex.quote(str(value))]
    parts += ["--observations", str(j["observations"]), "--episodes", str(j["episodes"]), "--seed", str(j["seed"])]
    return " ".join(parts)


def summary(bundle: Any, plan: dict[str, Any], args: Any) -> str:
    final = plan["final"]
    lines = [f"plan {plan['lower']} → {bundle.root}: kept in fp32: {', '.join(plan['kept']) or 'none'}; "
             f"{'verify passes it' if final['ok'] else 'verify FAILS it'} (badness {final['badness']})"]  # fmt: skip
    for layer in plan["layers"]:
        s = layer.get("sensitivity") or {}
        badness = f"{s['badness']:.3g}" if s.get("badness") is not None else "-, " + "; ".join(s.get("broken", []))
        lines.append(
            f"  {layer['scope']:<28} {layer['precision']:<5} cost {layer['cost']:>7}  alone: "
            f"{'within' if s.get('ok') else 'beyond'} (badness {badness})"
        )
    every = plan["all_lowered"]
    lines.append(f"  every layer lowered: {'within' if every['ok'] else 'beyond'} the bounds"
                 + (f": {'; '.join(every['broken'][:2])}" if every.get("broken") else ""))  # fmt: skip
    lines.append(f"verify it (the same judge): {verify_command(bundle, plan, args)}")
    return "\n".join(lines)


if __name__ == "__main__":
    run_cli(main)
