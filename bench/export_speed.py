"""Wall time of an export, against the rules it replaced: each step it saves is a MindSpore compile (~0.25 s for a
small policy).

- ONNX: the exporter makes the batch symbolic by comparing exports at several batch sizes. It exports at two; a third
  only checks the rewrite of a constant that differs. Before, it always exported three.
- Self-check: each written file is compared with the Cell run as verify's reference runs it (PyNative). Before, with
  the Cell compiled (``ms-graph``), a compile per graph.

The arms run in one process, alternating, so the machine's load moves them alike: "before" (both old rules),
"self-check only" (the new self-check, the third ONNX export kept where it is not needed) and "now". Cases: a trained
CartPole-v1 and Pendulum-v1 policy (mindir, onnx and .ms; trained for 256 steps), and an actor whose
``zeros_like``/reshape the exporter freezes at its batch (three ONNX exports under every rule).

    .venv/bin/python bench/export_speed.py --repeats 5
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from msrl_consistency import compat  # noqa: E402

compat.set_device("cpu")
compat.set_threads(1)

import foreign_policies as fp  # noqa: E402
from conftest import train_tiny  # noqa: E402

from inference.machine.facts import cpu_summary  # noqa: E402
from msrl_consistency.api import export_policy, export_run  # noqa: E402
from msrl_consistency.artifacts import graphs, selfcheck  # noqa: E402
from msrl_consistency.artifacts.bundle import ExportOptions  # noqa: E402

# arm: (always a third ONNX export, the self-check's reference)
ARMS = {"before": (True, "ms-graph"), "self-check only": (True, selfcheck.REFERENCE),
        "now": (False, selfcheck.REFERENCE)}  # fmt: skip


def timed(export: Callable[[Path], object], out: Path, arm: str) -> float:
    third_always, reference = ARMS[arm]
    rule, now = graphs.batch_dependent, selfcheck.REFERENCE
    if third_always:
        graphs.batch_dependent = lambda models: True
    selfcheck.REFERENCE = reference
    try:
        start = time.perf_counter()
        export(out)
        return time.perf_counter() - start
    finally:
        graphs.batch_dependent, selfcheck.REFERENCE = rule, now


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="export-speed-"))
    ckpts = {env: train_tiny(work / env, env) for env in ("CartPole-v1", "Pendulum-v1")}
    cases: dict[str, Callable[[Path], object]] = {
        f"{env} (trained, mindir + onnx + ms)": (lambda out, c=ckpt: export_run(c, out, ExportOptions()))
        for env, ckpt in ckpts.items()
    }
    cases["zeros_like actor (onnx frozen at its batch)"] = lambda out: export_policy(
        fp.make_old_style(), fp.OLD_STYLE_CONTRACT, out
    )
    times: dict[str, dict[str, list[float]]] = {name: {arm: [] for arm in ARMS} for name in cases}
    for c, (name, export) in enumerate(cases.items()):
        export(work / f"{c}-warm")  # imports and first-use costs, not timed
        for k in range(args.repeats):
            for a, arm in enumerate(ARMS):
                times[name][arm].append(timed(export, work / f"{c}-{k}-{a}", arm))
    print(f"{time.strftime('%Y-%m-%d')}, {cpu_summary()}, {args.repeats} alternating exports each, "
          f"`python bench/export_speed.py --repeats {args.repeats}`\n")  # fmt: skip
    print("| policy | before, s (median) | self-check only, s | now, s | now vs before |")
    print("|---|---:|---:|---:|---:|")
    for name, by in times.items():
        before, checked, now = (statistics.median(by[arm]) for arm in ARMS)
        print(f"| {name} | {before:.2f} | {checked:.2f} | {now:.2f} | {now / before:.2f}x |")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
