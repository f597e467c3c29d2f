"""``python -m inference.report diff OLD NEW``: what changed between two runs, and whether NEW regressed.

OLD and NEW are report directories (or their report.json) written by ``verify``, ``verify --audit`` or
``inference.check``. Prints one summary line, then each change (regressions first), and writes a page of the
comparison (``--out``, default ``diff.html`` beside NEW's report). Exit codes: 0 equivalent or changed without a
regression, 1 NEW regressed against OLD, 2 bad input (one ``error:`` line). No MindSpore needed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from inference.errors import UsageError, run_cli

EXITS = "exit codes: 0 equivalent (or changed without a regression), 1 NEW regressed against OLD, 2 bad input"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m inference.report", description=__doc__.splitlines()[0], epilog=EXITS)
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("diff", help="compare two runs' reports", description=__doc__.split("\n", 2)[2].strip(),
                       epilog=EXITS)  # fmt: skip
    d.add_argument("old", type=Path, help="the earlier run: a report directory or its report.json (e.g. the last good)")
    d.add_argument("new", type=Path, help="the run to judge against it")
    d.add_argument("--out", type=Path, help="the comparison page (default: diff.html in NEW's report directory)")
    d.add_argument("--json", type=Path, help="also write the changes as JSON")
    d.add_argument("--quiet", action="store_true", help="print only the summary line")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from inference.report.diff import diff_runs, regressed, summary
    from inference.report.diff_page import diff_page
    from inference.report.reading import load_run

    old, new = load_run(args.old), load_run(args.new)
    if args.out is None:  # beside NEW's report, never the working directory
        args.out = (args.new if args.new.is_dir() else args.new.parent) / "diff.html"
    for path in (args.out, args.json):
        if path is not None and path.is_dir():
            raise UsageError(f"{path} is a directory; pass a file name for the page")
    changes = diff_runs(old, new)
    line = summary(changes)
    _write(args.out, diff_page(old, new, changes, args.out))
    if args.json is not None:
        doc = {"old": str(args.old), "new": str(args.new), "regressed": regressed(changes), "summary": line,
               "changes": [c.to_dict() for c in changes]}  # fmt: skip
        _write(args.json, json.dumps(doc, indent=2) + "\n")
    print(line)
    if not args.quiet:
        for c in changes:
            print(f"  {c.effect:<11} {c.kind:<10} {c.line()}")
        print(f"page: {args.out}")
    return 1 if regressed(changes) else 0


def _write(path: Path, text: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None


if __name__ == "__main__":
    run_cli(main)
