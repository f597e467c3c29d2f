"""The doctor's Lite rows: how Lite runs a bundle here. One seeded call in this process (does the graph run on the
calling thread?), every graph run both ways (inline and handed off to Lite's actor thread: bitwise equal?), and the
emulated ARM runtime (``lite-aarch64``: available here, on which CPU model; with ``--aarch64`` the same two-way
comparison through its runner, the ARM kernels under qemu-user). ``Finding`` is the row every doctor check is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.bundle import Bundle, BundleError
from inference.compare.feeds import seeded_feeds
from inference.compare.inline import compare_inline
from inference.lite import emulation as emu
from inference.lite.client import LiteRunner
from inference.lite.common import LiteRunnerError
from inference.lite.inprocess import LiteModel, in_process_reason, open_lite
from inference.lite.runner_info import RunnerInfo, choose_format

OK, WARN, INCOMPATIBLE, INFO = "ok", "warn", "incompatible", "info"


@dataclass(frozen=True)
class Finding:
    name: str
    status: str  # ok | warn | incompatible | info
    here: str
    bundle: str
    detail: str
    evidence: list[str] | None = None  # what a warning rests on, line by line (JSON only)


def in_process_check(bundle: Bundle, info: RunnerInfo | None = None) -> Finding:
    """One seeded call of the deterministic graph through Lite in this process, on the file ``inference.load`` loads
    (``Bundle.lite_format``): does the graph run on the calling thread (``libmsrl-lite-inline.so``), or on Lite's
    actor thread, two thread wake-ups per call?"""
    name = "lite-in-process"
    why = in_process_reason()
    graph = bundle.mode_graph("deterministic")
    if why is not None:
        return Finding(name, INFO, "not here", "-", why)
    if graph is None:
        return Finding(name, INFO, "-", "no graph", "the bundle has no deterministic graph to run")
    try:
        path = bundle.file(graph, choose_format(bundle, graph, "auto", info)[0])
    except BundleError as exc:  # nothing Lite may load (the route checks say so too)
        return Finding(name, INFO, "-", graph, str(exc))
    try:
        with LiteModel(path) as model:
            model.infer(*seeded_feeds(bundle, 1, seed=0).graph_inputs(bundle, graph))
            inline, requested = model.runs_inline, model.inline_stats()["requested"]
    except (LiteRunnerError, ValueError) as exc:  # FeedError is a ValueError
        return Finding(name, WARN, "fails", path.name, f"{type(exc).__name__}: {exc}")
    if inline:
        return Finding(name, OK, "on the calling thread", path.name, "one call ran on the caller's thread")
    why = ("this Lite's MindRT does not bind to libmsrl-lite-inline.so" if requested else
           "inline runs are off: MSRL_LITE_INLINE=0, or this Lite build is not one they were tested on "
           "(MSRL_LITE_INLINE=1 asks for them; lite-inline-vs-handoff shows whether they agree here)")  # fmt: skip
    return Finding(name, WARN, "on Lite's actor thread", path.name, f"every call pays two thread wake-ups: {why}")


def inline_bits_check(bundle: Bundle, info: RunnerInfo) -> Finding:
    """Every graph opened both ways (inline and handed off to Lite's actor thread, whatever the default here), fed
    the same seeded rows: the answers must be bitwise equal, and asking for inline runs must take."""
    name = "lite-inline-vs-handoff"
    files = {}
    for graph in bundle.graphs:
        try:
            files[graph] = bundle.file(graph, choose_format(bundle, graph, "auto", info)[0])
        except BundleError:  # nothing Lite may load: the route checks say why
            continue
    if not files:
        return Finding(name, INFO, "-", "no graph", "no graph has a file Lite may load")
    where = "in this process" if in_process_reason() is None else "in the runner process"
    loaded = ", ".join(p.name for p in files.values())
    try:
        result = compare_inline(bundle, files, lambda path, inline: open_lite(path, inline=inline))
    except (LiteRunnerError, ValueError) as exc:  # FeedError is a ValueError
        return Finding(name, WARN, "fails", loaded, f"{type(exc).__name__}: {exc}")
    if result.differences:
        return Finding(name, WARN, f"differ ({where})", loaded, result.summary(), result.differences)
    if result.not_inline:
        return Finding(name, WARN, f"inline does not take ({where})", loaded,
                     result.summary() + "; this Lite's MindRT does not bind to libmsrl-lite-inline.so")  # fmt: skip
    return Finding(name, OK, f"bitwise equal ({where})", loaded, result.summary())


def inline_default(record: dict[str, Any] | None) -> str:
    if not record:
        return "inline runs: not recorded by the build (off unless MSRL_LITE_INLINE=1)"
    return f"inline runs {'on' if record.get('default') else 'off'} by default ({record.get('why', '?')})"


# ---- lite-aarch64: the ARM kernels under emulation ----------------------------------------------------------------


def aarch64_environment() -> dict[str, Any]:
    """Whether ``lite-aarch64`` runs here, which runner, and the CPU model it emulates (``--arm-cpu``)."""
    if emu.native():
        return {"native": True, "available": False, "reason": "this host is aarch64: the lite runtime runs Lite's ARM "
                "kernels natively"}  # fmt: skip
    try:
        cpu = emu.arm_cpu()
    except ValueError as exc:
        return {"native": False, "available": False, "reason": str(exc)}
    reason = emu.unavailable_reason()
    record = emu.build_record() if reason is None else {}
    return {
        "native": False,
        "available": reason is None,
        "reason": reason,
        "runner": str(emu.aarch64_runner()),
        "cpu": cpu,
        "qemu": emu.qemu_version() if reason is None else None,
        "lite_version": record.get("lite_version"),
        "max_mind_ir_version": record.get("max_mind_ir_version"),
        "probed_cpu": (record.get("emulation") or {}).get("probed_cpu"),
        "inline": record.get("inline"),
    }


def aarch64_row(env: dict[str, Any]) -> str:
    """The environment table's ``lite-aarch64`` line."""
    if env.get("native") or not env.get("available"):
        return ("not needed: " if env.get("native") else "unavailable: ") + str(env.get("reason"))
    limit = env["max_mind_ir_version"] if env["max_mind_ir_version"] is not None else "?"
    return (f"available: {env['runner']}: Lite {env['lite_version']} for aarch64 under {env['qemu']}, emulating "
            f"{env['cpu']} (--arm-cpu; MindIR <= v{limit} probed on {env['probed_cpu'] or '?'}); "
            f"{inline_default(env.get('inline'))}")  # fmt: skip


def aarch64_checks(bundle: Bundle) -> list[Finding]:
    """The bundle through ``lite-aarch64`` both ways (the ARM kernels inline and handed off): bitwise equal?"""
    name = "lite-aarch64-inline-vs-handoff"
    env = aarch64_environment()
    if not env["available"]:
        return [Finding(name, INFO, "-", "-", str(env["reason"]))]
    files = {}
    for graph in bundle.graphs:
        try:
            files[graph] = bundle.file(graph, "ms")
        except BundleError:
            continue
    if not files:
        return [Finding(name, INFO, "-", "no graph", "no graph has a .ms Lite may load")]
    loaded = ", ".join(p.name for p in files.values())

    def open_arm(path: Path, inline: bool) -> LiteRunner:
        return LiteRunner(path, runner=emu.aarch64_runner(), launcher=emu.launcher(), inline=inline, timeout=600,
                          load_timeout=600)  # fmt: skip

    where = f"ARM kernels, -cpu {env['cpu']}"
    try:
        result = compare_inline(bundle, files, open_arm)
    except (LiteRunnerError, ValueError) as exc:
        return [Finding(name, WARN, "fails", loaded, f"{type(exc).__name__}: {exc}")]
    if result.differences:
        return [Finding(name, WARN, f"differ ({where})", loaded, result.summary(), result.differences)]
    if result.not_inline:
        return [Finding(name, WARN, f"inline does not take ({where})", loaded, result.summary())]
    return [Finding(name, OK, f"bitwise equal ({where})", loaded, result.summary())]
