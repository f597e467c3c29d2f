"""Wall time and peak memory of a full verify (10k observations, 20 episodes per mode, every available runtime)
per policy.

Cases: our CartPole-v1 bundle; the bring-your-own examples (a Pendulum ``PolicyNet`` 64x64 exported with
plain ``mindspore.export`` and as a bundle, a CartPole DQN Q-network, a GRU carrying its state, a CNN on uint8
camera frames from the team's own env), which never touch our trainer; a two-head policy on a ``MultiDiscrete``
env and a ``Dict``-observation policy (``tests/foreign_policies.py``); an Atari-style CNN on 84x84x4 uint8 frames
(the classic torso: conv 32 8x8/4, 64 4x4/2, 64 3x3/1, dense 512) and a robot's ``Dict`` policy (24 joints and a
64x64x3 camera), on envs of 200-step episodes that draw those observations (``tests/shaped_policies.py``); and,
when given with ``--biped-bundle``/``--biped-ckpt``, a BipedalWalker-v3 bundle (256-256-128, episodes up to
1,600 steps). Each row also shows the reference-only time measured in the same run (``--runtimes ms-graph``:
builds the reference and compares one runtime) as its baseline, the full verify's CPU time, and its peak resident
memory: of the verify process, and with the Lite runner process it starts. Targets: every full verify <= 60 s,
except the 84x84x4 frame CNN: <= 120 s; every peak <= 1.5 GB.

A second table times localisation: the CartPole bundle exported with one hidden layer's weight scaled (every
runtime fails at the network stage), verified with ``--no-localize`` (baseline) and as by default (each failing
runtime names its first diverging layer). Target: at most 10 s added.

    python bench/verify_speed.py [--only SUBSTRING] [--biped-bundle B --biped-ckpt C]
"""

from __future__ import annotations

import argparse
import datetime
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil
from inference_latency import prepare

from inference.machine.facts import host_cpu

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "bring-your-own"
TESTS = Path(__file__).resolve().parents[1] / "tests"
FRAMES = "Atari-style CNN on uint8 84x84x4 frames (3 conv + dense 512), bundle"
TARGET_S = 60.0
FRAMES_TARGET_S = 120.0  # the 84x84x4 frame CNN
TARGET_GB = 1.5
GB = 2**30


class Run:
    """One verify: wall and CPU seconds, exit code, peak RSS of the verify process and of it with its children."""

    def __init__(self, args: list[str], cwd: Path | None = None) -> None:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        proc = psutil.Popen([sys.executable, "-m", "msrl_consistency.verify", *args, "--quiet"], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        self.peak, self.peak_tree = 0, 0
        while proc.poll() is None:
            try:
                sizes = [p.memory_info().rss for p in (proc, *proc.children(recursive=True))]
            except psutil.Error:
                continue
            self.peak, self.peak_tree = max(self.peak, sizes[0]), max(self.peak_tree, sum(sizes))
            time.sleep(0.1)
        _, err = proc.communicate()
        self.wall, self.code = time.perf_counter() - start, proc.returncode
        after = resource.getrusage(resource.RUSAGE_CHILDREN)  # verify and the processes it waited for
        self.cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if self.code not in (0, 1):
            sys.exit(f"verify {' '.join(args)} failed:\n{err[-2000:]}")


def timed(args: list[str], cwd: Path | None = None) -> tuple[float, int]:
    run = Run(args, cwd)
    return run.wall, run.code


def example(name: str, out: Path, *train_args: str) -> Path:
    """Copy an example to ``out`` and run its own training script once (a few seconds)."""
    work = out / name
    if not work.exists():
        shutil.copytree(EXAMPLES / name, work)
        subprocess.run([sys.executable, "train.py", *train_args], cwd=work, check=True, capture_output=True)
    return work


def exported(work: Path, factory: str, contract: str) -> None:
    if not (work / "bundle" / "manifest.json").exists():
        subprocess.run([sys.executable, "-m", "msrl_consistency.export", "--cell", factory, "--contract", contract,
                        *(["--ckpt", "policy.ckpt"] if (work / "policy.ckpt").exists() else []), "--out", "bundle"],
                       cwd=work, check=True, capture_output=True)  # fmt: skip


FAULTY = """
import sys
from pathlib import Path
from msrl_consistency.agent import PolicySpec
from msrl_consistency.api import export_run
from msrl_consistency.artifacts import run_dir as rd
from msrl_consistency.artifacts.bundle import ExportOptions
from msrl_consistency.artifacts.checkpoint import load_policy
ckpt, out = Path(sys.argv[1]), Path(sys.argv[2])
policy = load_policy(ckpt, PolicySpec.from_dict(rd.read_run_json(ckpt.parent)["policy_spec"]))
weight = policy.actor.layers[2].weight
weight.set_data(type(weight.value())(weight.asnumpy() * 1.5))
export_run(ckpt, out, ExportOptions(), policy=policy, force=True)
"""


def faulty_bundle(ckpt: Path, out: Path) -> Path:
    """The checkpoint's policy with ``actor.layers.2``'s weight scaled by 1.5, exported to every format."""
    bundle = out / "bundle-cartpole-faulty"
    if not (bundle / "manifest.json").exists():
        subprocess.run([sys.executable, "-c", FAULTY, str(ckpt), str(bundle)], check=True, capture_output=True)
    return bundle


MODULES = ("foreign_policies.py", "foreign_envs.py", "shaped_policies.py")


def shapes(out: Path) -> Path:
    """A team directory with the two-head, Dict, frame-CNN and robot policies (and their envs) and their contracts
    as TOML."""
    work = out / "shapes"
    work.mkdir(parents=True, exist_ok=True)
    for name in MODULES:
        shutil.copy(TESTS / name, work)
    sys.path.insert(0, str(work))
    import foreign_policies as fp
    import shaped_policies as sp

    for name, contract in (("two_head", fp.TWO_HEAD_CONTRACT), ("dict", fp.DICT_CONTRACT),
                           ("frames", sp.ATARI_CONTRACT), ("robot", sp.DICT_ROBOT_CONTRACT)):  # fmt: skip
        (work / name).mkdir(exist_ok=True)
        for module in MODULES:
            shutil.copy(TESTS / module, work / name)
        (work / name / "contract.toml").write_text(toml(contract))
    return work


def toml(data: dict, prefix: str = "") -> str:
    """A contract dict as TOML (tables and inline tables; enough for contracts)."""
    scalars = {k: v for k, v in data.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in data.items() if isinstance(v, dict)}
    lines = [f"[{prefix}]"] if prefix and scalars else []
    lines += [f"{k} = {_value(v)}" for k, v in scalars.items()]
    for k, v in tables.items():
        lines += ["", toml(v, f"{prefix}.{k}" if prefix else k)]
    return "\n".join(lines) + "\n"


def _value(v) -> str:  # noqa: ANN001
    import json

    return json.dumps(v)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("reports/bench/verify_speed"))
    p.add_argument("--only", default="", help="run only the policies whose label contains this")
    p.add_argument("--biped-bundle", type=Path, help="a BipedalWalker-v3 bundle (export of a trained run)")
    p.add_argument("--biped-ckpt", type=Path, help="its checkpoint")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    full = ["--observations", "10000", "--episodes", "20"]
    bundle, ckpt = prepare(args.out)
    pendulum = example("pendulum", args.out.resolve(), "--iterations", "10")
    dqn = example("cartpole-dqn", args.out.resolve(), "--steps", "3000")
    recurrent = example("recurrent", args.out.resolve())
    pixel = example("pixel", args.out.resolve())
    exported(recurrent, "policy:make_policy", "contract.toml")
    exported(pixel, "policy:make_policy", "contract.toml")
    team = shapes(args.out.resolve())
    exported(team / "two_head", "foreign_policies:make_two_head", "contract.toml")
    exported(team / "dict", "foreign_policies:make_dict_policy", "contract.toml")
    exported(team / "frames", "shaped_policies:make_atari_cnn", "contract.toml")
    exported(team / "robot", "shaped_policies:make_dict_robot", "contract.toml")
    if not (pendulum / "bundle" / "manifest.json").exists():
        subprocess.run([sys.executable, "-m", "msrl_consistency.export", "--cell", "policy:make_policy", "--ckpt",
                        "policy.ckpt", "--contract", "contract.toml", "--out", "bundle"], cwd=pendulum, check=True,
                       capture_output=True)  # fmt: skip
    cases: list[tuple[str, list[str], Path | None]] = [
        ("CartPole-v1, our bundle (64x64)", ["--bundle", str(bundle.resolve()), "--ckpt", str(ckpt.resolve())], None),
        ("Pendulum PolicyNet 64x64, user MindIR (no bundle)", ["--mindir", "policy_model.mindir", "--cell",
         "policy:make_policy", "--ckpt", "policy.ckpt", "--contract", "contract.toml"], pendulum),
        ("Pendulum PolicyNet 64x64, exported bundle", ["--bundle", "bundle", "--cell", "policy:make_policy"], pendulum),
        ("CartPole DQN 64x64, user MindIR", ["--mindir", "qnet.mindir", "--cell", "qnet:make_qnet", "--ckpt",
         "qnet.ckpt", "--contract", "contract.toml"], dqn),
        ("CartPole GRU 16 (carried state), bundle", ["--bundle", "bundle", "--cell", "policy:make_policy"], recurrent),
        ("Pixel CNN on uint8 16x16x3 frames (team env), bundle", ["--bundle", "bundle", "--cell", "policy:make_policy",
         "--env", "pixel_env:make_env"], pixel),
        ("Two heads on MultiDiscrete([2, 3]), bundle", ["--bundle", "bundle", "--cell",
         "foreign_policies:make_two_head", "--env", "foreign_envs:make_two_head"], team / "two_head"),
        ("Dict observation (vector + uint8 frame), bundle", ["--bundle", "bundle", "--cell",
         "foreign_policies:make_dict_policy", "--env", "foreign_envs:make_dict"], team / "dict"),
        ("Robot Dict policy (24 joints + uint8 64x64x3 camera), bundle", ["--bundle", "bundle", "--cell",
         "shaped_policies:make_dict_robot", "--env", "shaped_policies:make_robot_env"], team / "robot"),
        (FRAMES, ["--bundle", "bundle", "--cell", "shaped_policies:make_atari_cnn", "--env",
         "shaped_policies:make_frame_env"], team / "frames"),
    ]  # fmt: skip
    if args.biped_bundle and args.biped_ckpt:
        biped = ["--bundle", str(args.biped_bundle.resolve()), "--ckpt", str(args.biped_ckpt.resolve())]
        cases.append(("BipedalWalker-v3 256-256-128, our bundle", biped, None))
    print(
        f"{datetime.date.today()}, {host_cpu()[0]} ({psutil.cpu_count()} CPUs, load average "
        f"{psutil.getloadavg()[0]:.1f} at the start), `python {' '.join(sys.argv)}`\n"
    )
    print(
        "| policy | reference + ms-graph (s) | full verify (s) | full / reference-only | CPU (s) | peak RSS (GB) | "
        "with the Lite runner (GB) | exit | time target | <= 1.5 GB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for k, (label, case, cwd) in enumerate(cases):
        if args.only not in label:
            continue
        base, _ = timed([*case, *full, "--runtimes", "ms-graph", "--out", str((args.out / f"ref-{k}").resolve())], cwd)
        run = Run([*case, *full, "--out", str((args.out / f"full-{k}").resolve())], cwd)
        target = FRAMES_TARGET_S if label == FRAMES else TARGET_S
        verdict = f"{'yes' if run.wall <= target else 'no'} (<= {target:.0f} s)"
        memory = "yes" if run.peak_tree <= TARGET_GB * GB else "no"
        print(
            f"| {label} | {base:.1f} | {run.wall:.1f} | {run.wall / base:.2f}x | {run.cpu:.1f} | "
            f"{run.peak / GB:.2f} | {run.peak_tree / GB:.2f} | {run.code} | {verdict} | {memory} |",
            flush=True,
        )
    if args.only:
        return
    faulty = ["--bundle", str(faulty_bundle(ckpt, args.out).resolve()), "--ckpt", str(ckpt.resolve()), *full]
    print("\n| failing policy | --no-localize (s) | localized (s) | added (s) | exit | added <= 10 s |")
    print("|---|---:|---:|---:|---:|---|")
    base, _ = timed([*faulty, "--no-localize", "--out", str((args.out / "faulty-base").resolve())])
    total, code = timed([*faulty, "--out", str((args.out / "faulty-localized").resolve())])
    verdict = "yes" if total - base <= 10 else "no"
    print(
        f"| CartPole-v1, actor.layers.2 x1.5 (every runtime fails) | {base:.1f} | {total:.1f} | {total - base:.1f} | "
        f"{code} | {verdict} |",
        flush=True,
    )


if __name__ == "__main__":
    main()
