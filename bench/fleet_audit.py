"""A fleet's audit on one machine: ``verify --fleet`` with the local engine against Ray, and the per-chunk cost.

Records ``--devices`` CartPole recordings of ``--steps`` steps each on the deploy side (Lite in a process without
MindSpore, batch-64 calls on seeded observations, chunks of 16,384 steps; two recorders at a time), then audits the
fleet once per engine, each in a process of its own. Per engine: the wall time of the audit (the command's own
start-up excluded: Python, MindSpore and the bundle load the same on both), the driver's peak resident set and each
Ray worker's (``VmHWM``), and whether the device rows equal the local engine's. The local run also splits its time
into judging (the training path's rerun and verify's comparison) and folding (each judged chunk into its device's
totals), both of which Ray's workers take over, and times reading every chunk (what the driver still does before it
ships them), from which the time on N machines of C cores follows: ``start-up + max((judging + folding) / (N x C),
reading)``.

    python bench/fleet_audit.py [--devices 50] [--steps 100000] [--out reports/bench/fleet_audit]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from inference_latency import prepare

from inference.machine.facts import measured_here

RECORD = """
import sys
sys.modules["mindspore"] = None
import numpy as np
import inference
bundle, out, steps, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rng = np.random.default_rng(seed)
policy = inference.load(bundle, record=out)
for _ in range(-(-steps // 64)):
    policy.act((rng.standard_normal((64, 4)) * 0.3).astype(np.float32))
    policy.observe(np.ones(64), rng.random(64) < 0.01)
policy.close()
"""


def record_fleet(bundle: Path, fleet: Path, devices: int, steps: int) -> None:
    """The fleet's recordings, two recorders at a time (kept when already there)."""
    todo = [k for k in range(devices) if not (fleet / f"device-{k:03d}").is_dir()]
    for start in range(0, len(todo), 2):
        procs = [subprocess.Popen([sys.executable, "-c", RECORD, str(bundle), str(fleet / f"device-{k:03d}"),
                                   str(steps), str(k)]) for k in todo[start : start + 2]]  # fmt: skip
        if any(p.wait() for p in procs):
            sys.exit("a recorder failed")


def child(engine_name: str, bundle_dir: Path, ckpt: Path, fleet: Path) -> None:
    """One engine's audit in this process; prints its measurements as JSON."""
    import msrl_consistency.runtimes  # noqa: F401
    from inference.bundle import load_bundle
    from inference.bundle.recording import index_recording, read_chunk
    from msrl_consistency.artifacts.cells import TrainerCells
    from msrl_consistency.fleet import audit_fleet, make_engine
    from msrl_consistency.fleet.report import device_row

    bundle = load_bundle(bundle_dir)
    cells = TrainerCells(ckpt, bundle.policy_spec)
    t = time.perf_counter()  # what stays on the driver with Ray: reading every chunk (then shipping it)
    for device in sorted(p for p in fleet.iterdir() if p.is_dir()):
        index = index_recording([device], bundle)
        for info in index.chunks:
            read_chunk(info, index.layout)
    reading = time.perf_counter() - t
    started = time.perf_counter()
    engine = make_engine(engine_name, cells, "cpu", None)
    judging = [0.0]
    if engine_name == "local":
        judge = engine.judge

        def timed(task, chunk):  # noqa: ANN001
            t = time.perf_counter()
            try:
                return judge(task, chunk)
            finally:
                judging[0] += time.perf_counter() - t

        engine.judge = timed
    workers_ready = time.perf_counter()
    pids = engine.pids() if engine_name == "ray" else []
    devices = audit_fleet(bundle, fleet, cells, ckpt, engine)
    wall = time.perf_counter() - started
    worker_mb = [_peak_mb(pid) for pid in pids]
    if engine_name == "local":
        engine.judge = judge
    engine.close()
    chunks = sum(d.facts.chunks for d in devices if d.facts)
    steps = sum(d.facts.steps for d in devices if d.facts)
    print(json.dumps({
        "wall": wall, "engine_start": workers_ready - started, "judging": judging[0], "reading": reading,
        "chunks": chunks, "steps": steps,
        "driver_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "worker_mb": worker_mb,
        "workers": len(pids) or 1, "rows": [json.dumps(device_row(d), sort_keys=True, default=str) for d in devices],
        "consistent": sum(d.status == "consistent" for d in devices), "devices": len(devices),
    }))  # fmt: skip


def _peak_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=int, default=50)
    p.add_argument("--steps", type=int, default=100_000, help="recorded steps per device")
    p.add_argument("--out", type=Path, default=Path("reports/bench/fleet_audit"))
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--bundle", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--ckpt", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    fleet = args.out / f"fleet-{args.devices}x{args.steps}"
    if args.child:
        child(args.child, args.bundle, args.ckpt, fleet)
        return
    args.out.mkdir(parents=True, exist_ok=True)
    bundle, ckpt = prepare(args.out)
    t = time.perf_counter()
    record_fleet(bundle, fleet, args.devices, args.steps)
    recorded = time.perf_counter() - t
    size = sum(f.stat().st_size for f in fleet.rglob("chunk-*.npz")) / 2**20
    how = f"recorded in {recorded:.0f} s" if recorded > 1 else "recorded before"
    print(measured_here(f"python bench/fleet_audit.py {' '.join(sys.argv[1:])}") + f"; {args.devices} devices x "
          f"{args.steps:,} steps ({size:.0f} MB of recordings, {how})\n")  # fmt: skip
    runs = {}
    for engine in ("local", "ray"):
        proc = subprocess.run([sys.executable, __file__, "--child", engine, "--bundle", str(bundle), "--ckpt",
                               str(ckpt), "--devices", str(args.devices), "--steps", str(args.steps), "--out",
                               str(args.out)], capture_output=True, text=True)  # fmt: skip
        if proc.returncode:
            sys.exit(f"{engine}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
        runs[engine] = json.loads(proc.stdout.strip().splitlines()[-1])
    local = runs["local"]
    print("| engine | workers | devices consistent | steps | wall s | vs local | engine start s | driver peak MB | "
          "worker peak MB | rows equal local's |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, r in runs.items():
        workers = ", ".join(f"{m:.0f}" for m in r["worker_mb"]) or "–"
        print(f"| {name} | {r['workers']} | {r['consistent']}/{r['devices']} | {r['steps']:,} | {r['wall']:.1f} | "
              f"{local['wall'] / r['wall']:.2f}x | {r['engine_start']:.1f} | {r['driver_mb']:.0f} | {workers} | "
              f"{r['rows'] == local['rows']} |")  # fmt: skip
    judge, reading = local["judging"], local["reading"]
    fold = local["wall"] - judge - reading - local["engine_start"]
    chunks = max(1, local["chunks"])
    print(f"\nPer chunk (local engine, {chunks} chunks of up to 16,384 steps): judging {judge / chunks * 1e3:.0f} ms "
          f"({judge:.1f} s in all), folding and the rest {fold / chunks * 1e3:.0f} ms ({fold:.1f} s), reading "
          f"{reading / chunks * 1e3:.1f} ms ({reading:.1f} s). With Ray the workers judge and fold; the driver reads "
          "and ships.\n")  # fmt: skip
    print("| machines x cores | estimated wall s after start-up ((judging + folding) / workers, at least reading) |")
    print("|---|---:|")
    for machines, cores in ((1, 2), (4, 8), (16, 32), (64, 32)):
        print(f"| {machines} x {cores} | {max((judge + fold) / (machines * cores), reading):.1f} |")


if __name__ == "__main__":
    main()
