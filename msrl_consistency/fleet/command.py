"""``verify --fleet``: the fleet's audit from the command line, its reports and its exit code."""

from __future__ import annotations

import argparse
import datetime as dt
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inference.bundle import Bundle
from inference.errors import UsageError
from inference.report.writers import check_report_dir
from msrl_consistency.fleet import ENGINES, audit_fleet, devices_in, exit_code, make_engine
from msrl_consistency.fleet.report import FLEET_FILES, fleet_dict, write_fleet


def add_fleet_args(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("a fleet (one recording per device)")
    group.add_argument("--fleet", type=Path, metavar="DIR",
                       help="audit every device's recording: DIR's sub-directories, each named after its device "
                       "(as --audit audits one); with --bundle. Exit 1: a device inconsistent or recorded with another "
                       "bundle; 3: a device (or all) could not be audited")  # fmt: skip
    group.add_argument("--engine", choices=ENGINES, default="local",
                       help="where the chunks are judged: this process, or Ray workers (one per CPU)")  # fmt: skip
    group.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="join this Ray cluster (default with --engine ray: a local Ray on this machine's cores)",
    )


def check_fleet_args(args: argparse.Namespace) -> None:
    if args.fleet is None:
        if args.engine != "local" or args.ray_address:
            raise UsageError("--engine and --ray-address choose where a --fleet is audited")
        return
    if args.audit or args.golden or args.save_golden or args.bundle is None:
        raise UsageError("--fleet audits recordings against the training path of a --bundle (no --audit, no golden)")
    if args.ray_address and args.engine != "ray":
        raise UsageError("--ray-address joins a Ray cluster: pass --engine ray")
    devices_in(args.fleet)  # a directory with at least one device
    check_report_dir(args.out, FLEET_FILES)


def run_fleet(
    args: argparse.Namespace, bundle: Bundle, cells: Any, checkpoint: Path | None, options: Any,
    progress: Callable[[str], None], command: list[str],
) -> int:  # fmt: skip
    """Audit the fleet, write its reports, say the verdict in one line; the exit code."""
    from msrl_consistency.localization import CellLocalizer

    started = time.perf_counter()
    engine = make_engine(args.engine, cells, options.device, args.ray_address)
    try:
        devices = audit_fleet(bundle, args.fleet, cells, checkpoint, engine, windows=args.audit_windows,
                              tolerance=options.tolerance, overrides=options.overrides,
                              localizer=CellLocalizer(bundle, cells, options.device), localize=options.localize,
                              progress=progress)  # fmt: skip
        run = {**engine.facts(), "wall_s": time.perf_counter() - started, "command": command,
               "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}  # fmt: skip
    finally:
        engine.close()
    subject = {"bundle": str(bundle.root), "checkpoint": str(checkpoint), "fleet": str(args.fleet)}
    data = fleet_dict(devices, subject, run)
    write_fleet(devices, data, args.out)
    counts = ", ".join(f"{n} {s}" for s, n in data["counts"].items())
    failing = [d.name for d in devices if d.status != "consistent"]
    named = f" ({', '.join(failing[:5])}{', ...' if len(failing) > 5 else ''})" if failing else ""
    print(f"{data['verdict'].lower()}: {len(devices)} devices: {counts}{named}; reports in {args.out}/ "
          f"({', '.join(FLEET_FILES)}); {run['wall_s']:.1f} s")  # fmt: skip
    return exit_code(devices)
