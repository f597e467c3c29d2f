"""``python -m inference.doctor [BUNDLE]``: this box's versions next to what a bundle pins, and which pairs clash.

Run it on either box. It prints Python, NumPy, Gymnasium, MindSpore (from package metadata: never imported),
the Lite SDK the runner was built against and the MindIR versions it loads, the CANN toolkit and driver if an
Ascend install is found, Ascend devices, and the CPU model with its SIMD level (AVX2 / AVX-512 / NEON give
different float roundings). With a bundle, each pin of its manifest is checked against this box:

* a graph is deployable if one route works: its ``.mindir`` (version <= what this Lite loads) or its ``.ms``
  (written by a converter of the same Lite release: Lite only warns on a mismatch, then may fail to build);
* NumPy and Gymnasium versions differing from training: a warning (seeded noise streams and env dynamics are
  only guaranteed within one version);
* ``--device ascend`` without CANN or a device: incompatible;
* on the CPU, one seeded call of the deterministic graph's ``.ms`` through Lite in this process, as the deploy side
  runs it: whether the graph ran on the calling thread, or pays Lite's hand-off to its actor thread on every call;
  and every graph opened both ways (on the calling thread and handed off to Lite's actor thread) on the same seeded
  rows: whether the answers are bitwise equal (a difference is a warning with the evidence);
* ``lite-aarch64`` (Lite's ARM kernels under qemu-user): whether it runs here and which CPU model it emulates;
  ``--aarch64`` runs the bundle through it both ways too (``lite_rows.py``).

Exit codes: 0 compatible (warnings allowed), 1 an incompatible pair, 2 bad input (one ``error:`` line).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from inference.bundle import Bundle, BundleError, load_bundle
from inference.bundle.mindir import read_header
from inference.doctor.lite_rows import (
    INCOMPATIBLE,
    INFO,
    OK,
    WARN,
    Finding,
    aarch64_checks,
    aarch64_environment,
    aarch64_row,
    in_process_check,
    inline_bits_check,
    inline_default,
)
from inference.errors import run_cli
from inference.lite.emulation import add_arm_cpu, apply_arm_cpu
from inference.lite.runner_info import RunnerInfo, choose_format, runner_info
from inference.machine.facts import environment

_LITE_VERSION = re.compile(rb"MindSpore Lite (\d+\.\d+\.\d+[0-9A-Za-z.+-]*)")


# ---- the bundle's pins ---------------------------------------------------------------------------------------


def ms_lite_version(path: Path) -> str | None:
    """The converter release a .ms was written by: its flatbuffer's version string, e.g. "MindSpore Lite 2.0.0"."""
    try:
        found = _LITE_VERSION.search(path.read_bytes())
    except OSError:
        return None
    return found.group(1).decode() if found else None


def _minor(version: str | None) -> tuple[str, ...]:
    return tuple((version or "").split(".")[:2])


def _route_checks(bundle: Bundle, graph: str, info: RunnerInfo | None) -> list[Finding]:
    """The .mindir and .ms routes of one graph; a route that fails is only a warning if the other one works."""
    lite = info.lite_version if info else None
    here = f"Lite {lite or '?'}"
    routes: list[Finding] = []
    if bundle.has_file(graph, "mindir"):
        version = read_header(bundle.file(graph, "mindir")).mind_ir_version
        loads = info.mindir_loads(version) if info else None
        limit = "?" if info is None or info.max_mind_ir_version is None else str(info.max_mind_ir_version)
        status = {True: OK, False: INCOMPATIBLE, None: WARN}[loads]
        detail = {
            True: "loads directly",
            False: f"Lite {lite} loads MindIR <= v{limit} (mind_ir::Version_MAX)",
            None: "cannot tell which MindIR versions this Lite loads (runner not probed)",
        }[loads]
        routes.append(Finding(f"{graph}.mindir", status, f"{here} (MindIR <= v{limit})", f"MindIR v{version}", detail))
    if bundle.has_file(graph, "ms"):
        written = ms_lite_version(bundle.file(graph, "ms")) or bundle.manifest.get("exporter", {}).get("lite_sdk")
        if lite is None or written is None:
            status, detail = WARN, "cannot tell the Lite release on one side"
        elif written == lite:
            status, detail = OK, "same Lite release"
        elif _minor(written) == _minor(lite):
            status, detail = WARN, "same Lite minor release, different patch"
        else:
            status, detail = INCOMPATIBLE, "a .ms must be converted by the runtime's Lite release: re-convert it"
        routes.append(Finding(f"{graph}.ms", status, here, f"converted by Lite {written or '?'}", detail))
    for fmt in ("mindir", "ms"):
        failed = (bundle.graph(graph)["files"].get(fmt) or {}).get("failed")
        if failed:  # a route the export itself ruled out
            routes.append(Finding(f"{graph}.{fmt}", INCOMPATIBLE, here, "failed at export", failed))
    if any(c.status == OK for c in routes):
        routes = [
            Finding(c.name, WARN, c.here, c.bundle, c.detail + "; the other route is used")
            if c.status == INCOMPATIBLE
            else c
            for c in routes
        ]
    elif not routes:
        routes.append(Finding(graph, INCOMPATIBLE, here, "no .mindir or .ms", "nothing Lite can load"))
    try:  # the one file rule inference.load, play, bench and check's lite runtime follow
        fmt, why = choose_format(bundle, graph, "auto", info)
        routes.append(Finding(f"{graph} loads", INFO, here, f"{graph}.{fmt}", why))
    except BundleError:
        pass  # nothing Lite may load: said above
    return routes


def _version_check(name: str, here: str | None, pinned: str | None, why: str, missing: str = WARN) -> Finding:
    if pinned is None:
        return Finding(name, INFO, here or "-", "-", "not recorded by the bundle")
    if here is None:
        return Finding(name, missing, "not installed", pinned, why)
    if here == pinned:
        return Finding(name, OK, here, pinned, "same version")
    return Finding(name, WARN, here, pinned, why)


def bundle_checks(bundle: Bundle, env: dict[str, Any], info: RunnerInfo | None, device: str) -> list[Finding]:
    m = bundle.manifest
    exporter = m.get("exporter", {}) or {}
    train = (m.get("source", {}) or {}).get("train_versions", {}) or {}
    checks: list[Finding] = []
    if info is None:
        checks.append(
            Finding("lite-runner", INCOMPATIBLE, "not built", "-", "build it: bash inference/lite/build_lite.sh")
        )
    for graph in m.get("graphs") or {}:
        checks.extend(_route_checks(bundle, graph, info))
    checks.append(
        _version_check(
            "numpy",
            env["numpy"],
            train.get("numpy") or exporter.get("numpy"),
            "seeded noise streams (numpy.random.Generator) are only guaranteed within one NumPy version",
        )
    )
    checks.append(
        _version_check(
            "gymnasium",
            env["gymnasium"],
            train.get("gymnasium"),
            "env dynamics and reset seeding may change between Gymnasium releases (episodes, not actions)",
        )
    )
    py = exporter.get("python") or train.get("python")
    checks.append(
        Finding("python", INFO, env["python"], py or "-", "the deploy side does not depend on the training Python")
    )
    ms = exporter.get("mindspore") or train.get("mindspore")
    checks.append(
        Finding(
            "mindspore",
            INFO,
            env["mindspore"] or "not installed",
            ms or "-",
            "not needed on the deploy side (MindIR compatibility is the Lite check above)",
        )
    )
    host = (m.get("source", {}) or {}).get("train_host", {}) or {}
    if host.get("simd"):
        same = host["simd"] == env["simd"]
        checks.append(
            Finding(
                "cpu-simd",
                OK if same else WARN,
                env["simd"],
                host["simd"],
                "same SIMD level" if same else "float results may differ in the last bits; chaotic envs diverge",
            )
        )
    else:
        checks.append(
            Finding("cpu-simd", INFO, env["simd"], "-", "not recorded by the bundle; SIMD level changes float rounding")
        )
    checks.append(device_check(env, info, device))
    checks.append(precision_check(bundle, info, device))
    if device == "cpu" and info is not None:
        checks.append(in_process_check(bundle, info))
        checks.append(inline_bits_check(bundle, info))
    return checks


def precision_check(bundle: Bundle, info: RunnerInfo | None, device: str) -> Finding:
    """The Lite precision mode that will apply to the bundle on ``device`` here, and what Lite then computes in; an
    Ascend run whose mode would be left to Lite's default (fp16) cannot run (refused)."""
    import platform

    from inference.bundle.precision_mode import PrecisionModeMissing, lite_precision

    target = bundle.target
    pinned = f"target {target.get('device', 'cpu')}" + (f", {target['precision_mode']}" if target.get("precision_mode")
                                                         else "")  # fmt: skip
    arch = (info.record.get("arch") if info is not None else None) or platform.machine()
    try:
        chosen = lite_precision(bundle.manifest, device, arch, f"bundle {bundle.root}")
    except PrecisionModeMissing as exc:
        return Finding("precision", INCOMPATIBLE, "Lite's default: enforce_fp16", pinned, str(exc))
    mode = chosen.precision_mode or "none (CPU kernels)"
    emulated = (bundle.manifest.get("self_check") or {}).get("fp16_emulation") or {}
    if emulated.get("passed") is False:  # export's emulation of the target's fp16: the policy breaks there
        return Finding("precision", WARN, f"mode {mode}, computes in {chosen.preset}", pinned,
                     f"{chosen.why}; {emulated.get('reason')}; keep that layer in fp32: a precision plan "
                     "(--lower fp16) on the training side")  # fmt: skip
    return Finding("precision", OK, f"mode {mode}, computes in {chosen.preset}", pinned, chosen.why)


def device_check(env: dict[str, Any], info: RunnerInfo | None, device: str) -> Finding:
    if device == "cpu":
        return Finding("device", OK, f"cpu ({env['simd']})", "cpu", "CPU inference")
    missing = []
    if env["cann"] is None:
        missing.append("no CANN toolkit (set ASCEND_HOME_PATH or source set_env.sh)")
    if not env["ascend_devices"]:
        missing.append("no /dev/davinciN device")
    sdk_lib = Path(str((info.record if info else {}).get("sdk") or "")) if info else None
    if sdk_lib is not None and not any(
        sdk_lib.glob(pattern) for pattern in ("lib/libascend_kernel_plugin*.so", "runtime/lib/libascend_kernel_plugin*")
    ):
        missing.append("the runner's Lite SDK has no Ascend plugin")
    here = f"CANN {env['cann']['version']}" if env["cann"] else "no CANN"
    here += f", {len(env['ascend_devices'])} device(s)"
    return Finding("device", INCOMPATIBLE if missing else OK, here, "ascend", "; ".join(missing) or "Ascend available")


# ---- output ------------------------------------------------------------------------------------------------


def render(env: dict[str, Any], checks: list[Finding], bundle: Bundle | None) -> str:
    lite = env["lite"] or {}
    rows = [
        ("python", env["python"]),
        ("numpy", env["numpy"] or "not installed"),
        ("gymnasium", env["gymnasium"] or "not installed"),
        ("mindspore", env["mindspore"] or "not installed (not needed here)"),
        ("cpu", f"{env['cpu_model']} ({env['machine']}, {env['simd']})"),
        (
            "lite runner",
            f"{lite['runner']}: Lite {lite['lite_version']} (version from {lite.get('lite_version_source') or '?'}), "
            f"loads MindIR <= v{lite['max_mind_ir_version'] if lite['max_mind_ir_version'] is not None else '?'}, "
            f"{inline_default(lite.get('inline'))}"
            if lite
            else "not built (bash inference/lite/build_lite.sh)",
        ),
        ("lite-aarch64", aarch64_row(env["lite_aarch64"])),
        ("cann", f"{env['cann']['version']} ({env['cann']['path']})" if env["cann"] else "not found"),
        ("ascend", f"{len(env['ascend_devices'])} device(s), driver {env['ascend_driver'] or '?'}"),
    ]
    lines = ["environment"] + [f"  {k:<12} {v}" for k, v in rows]
    if checks:
        lines += ["", f"checks{f' against {bundle.root}' if bundle else ''}"]
        width = max(len(c.name) for c in checks)
        for c in checks:
            lines.append(f"  {c.status:<12} {c.name:<{width}}  here {c.here} | bundle {c.bundle} | {c.detail}")
        bad = [c.name for c in checks if c.status == INCOMPATIBLE]
        lines += ["", f"incompatible: {', '.join(bad)}" if bad else "compatible"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m inference.doctor", description=__doc__.splitlines()[0])
    p.add_argument("bundle", nargs="?", help="exported bundle directory to check against this box")
    p.add_argument("--runner", help="Lite runner binary (default: $MSRL_LITE_RUNNER or the built one)")
    p.add_argument("--device", default="cpu", choices=["cpu", "ascend"])
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument(
        "--aarch64",
        action="store_true",
        help="also run the bundle through lite-aarch64 (Lite's ARM "
        "kernels under qemu-user), inline and handed off, and compare the bits (tens of seconds)",
    )
    add_arm_cpu(p)
    args = p.parse_args(argv)
    apply_arm_cpu(args)
    try:
        if args.runner and not Path(args.runner).is_file():
            raise BundleError(f"--runner {args.runner} does not exist")
        if args.bundle and not Path(args.bundle).exists():
            raise BundleError(f"bundle {args.bundle} does not exist")
        bundle = load_bundle(args.bundle) if args.bundle else None
        info = runner_info(args.runner)
        env = {**environment(None if info is None else info.summary()), "lite_aarch64": aarch64_environment()}
        checks = bundle_checks(bundle, env, info, args.device) if bundle else []
        if bundle and args.aarch64:
            checks += aarch64_checks(bundle)
        if not bundle and args.device != "cpu":
            checks.append(device_check(env, info, args.device))
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    incompatible = any(c.status == INCOMPATIBLE for c in checks)
    if args.json:
        out = {
            "environment": env,
            "bundle": str(bundle.root) if bundle else None,
            "checks": [asdict(c) for c in checks],
            "compatible": not incompatible,
        }
        print(json.dumps(out, indent=2))
    else:
        print(render(env, checks, bundle))
    return 1 if incompatible else 0


def cli() -> None:
    """``python -m inference.doctor`` and ``msrl-doctor``: any unexpected error is one line, exit 2."""
    run_cli(main)


if __name__ == "__main__":
    cli()
