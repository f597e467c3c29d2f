"""Where `make test`'s CPU goes: per test file and per kind of work, as shares of the whole suite's CPU.

The suite on 2 cores is CPU-bound (both workers busy, ~1.8-1.9 cores used), so its wall time is its CPU time over
the cores: a change to the suite's time is a change to one of these rows. Runs pytest as `make test` does (2 workers,
one file per worker) with three probes, written to a temporary directory and put on PYTHONPATH:
- a pytest plugin: each test's wall time, its worker's own CPU and its subprocesses' CPU (getrusage), and the
  MindSpore graph compiles the worker ran (``_CellGraphExecutor.compile``: count and CPU);
- a ``sitecustomize`` in every Python subprocess: its command and its CPU (with its own children), at exit;
- what is left of the subprocesses' CPU is programs that are not Python (Lite runners, qemu, g++, pip, Chromium).

    python bench/suite_cost.py                    # the whole suite
    python bench/suite_cost.py tests/test_verify.py --workers 1
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from inference.machine.facts import cpu_summary  # noqa: E402

PLUGIN = """
import json, os, resource, time
import pytest

ROWS, COMPILES = [], [0, 0.0]


def _cpu():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def pytest_configure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    from mindspore.graph import api

    compile_ = api._CellGraphExecutor.compile

    def counted(self, *args, **kwargs):
        start = time.process_time()
        result = compile_(self, *args, **kwargs)
        if isinstance(result, tuple) and result[1]:  # (phase, False): compiled before, nothing compiled now
            COMPILES[0] += 1
            COMPILES[1] += time.process_time() - start
        return result

    api._CellGraphExecutor.compile = counted


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start, (me, kids), compiles = time.perf_counter(), _cpu(), list(COMPILES)
    yield
    me2, kids2 = _cpu()
    ROWS.append({"test": item.nodeid, "wall": time.perf_counter() - start, "self": me2 - me, "kids": kids2 - kids,
                 "compiles": COMPILES[0] - compiles[0], "compile_cpu": COMPILES[1] - compiles[1]})


def pytest_unconfigure(config):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        me, kids = _cpu()
        ROWS.append({"test": "", "self": me, "kids": kids, "pid": os.getpid()})
        with open(os.path.join(os.environ["SUITE_COST_DIR"], f"tests-{worker}.jsonl"), "w") as fh:
            fh.writelines(json.dumps(r) + "\\n" for r in ROWS)
"""

SITECUSTOMIZE = """
import atexit, os, resource, sys


def _record():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
    ms = str(int(sys.modules.get("mindspore") is not None))
    line = "\\t".join([str(os.getpid()), str(os.getppid()), f"{cpu:.3f}", ms, os.environ.get("PYTEST_CURRENT_TEST", ""),
                      " ".join(sys.argv)[:500].replace("\\t", " ").replace("\\n", " ")])
    try:
        with open(os.path.join(os.environ["SUITE_COST_DIR"], "processes.tsv"), "a") as fh:
            fh.write(line + "\\n")
    except OSError:
        pass


if os.environ.get("SUITE_COST_DIR"):
    atexit.register(_record)
"""


def command_kind(argv: str, mindspore: bool) -> str:
    """A Python subprocess by what it ran: the CLIs by module, the rest by whether they imported MindSpore."""
    argv = argv.replace(str(REPO) + "/", "")
    patterns = (
        (r"msrl_consistency/(\w+)(?:/__main__)?\.py", r"CLI \1"),
        (r"tests/fault_train\.py", "CLI train (test twin)"),
        (r"mindspore/parallel/cluster", "msrun"),
        (r"kernel_build_server", "MindSpore kernel build server"),
        (r"inference/([\w/]+?)(?:/__main__)?\.py", r"deploy \1"),
        (r"site-packages/pytest/__main__\.py", "nested pytest"),
    )
    for pattern, kind in patterns:
        found = re.search(pattern, argv)
        if found:
            return found.expand(kind).replace("/", ".")
    return "scripts and -c code, MindSpore" if mindspore else "scripts and -c code, no MindSpore"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", help="test files (default: the whole suite)")
    parser.add_argument("--workers", default="logical", help="pytest-xdist workers, as make test (default logical)")
    parser.add_argument("--top", type=int, default=25, help="test files listed (default 25)")
    parser.add_argument("--keep", type=Path, help="copy the raw records (per test, per subprocess) to this directory")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="suite-cost-") as tmp:
        out = Path(tmp)
        (out / "suite_cost_probe.py").write_text(PLUGIN)
        (out / "sitecustomize.py").write_text(SITECUSTOMIZE)
        env = {**os.environ, "SUITE_COST_DIR": tmp,
               "PYTHONPATH": os.pathsep.join(filter(None, [tmp, os.environ.get("PYTHONPATH")]))}  # fmt: skip
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "suite_cost_probe",
               "-n", args.workers, "--dist", "loadfile", *args.paths]  # fmt: skip
        start, before = time.perf_counter(), os.times()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        wall, after = time.perf_counter() - start, os.times()
        summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-300:]
        tests = [json.loads(line) for f in sorted(out.glob("tests-*.jsonl")) for line in f.read_text().splitlines()]
        procs = [line.split("\t") for line in (out / "processes.tsv").read_text().splitlines()
                 if line.count("\t") == 5] if (out / "processes.tsv").exists() else []  # fmt: skip
        if args.keep:
            shutil.copytree(out, args.keep, dirs_exist_ok=True)
    cpu = (after.children_user + after.children_system) - (before.children_user + before.children_system)
    report(args, summary, wall, cpu, tests, procs)
    failed = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    if failed:  # a suite that did not pass is no baseline: say which tests, on stderr
        print("\n".join(["tests that did not pass:", *failed]), file=sys.stderr)
    return proc.returncode


def report(args: argparse.Namespace, summary: str, wall: float, cpu: float, tests: list[dict], procs: list) -> None:
    workers = {int(t["pid"]): t for t in tests if not t["test"]}
    rows = [t for t in tests if t["test"]]
    per_file: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for t in rows:
        file_sums = per_file[t["test"].split("::")[0]]
        file_sums.update({k: t[k] for k in ("wall", "self", "kids", "compiles", "compile_cpu")})
        file_sums["tests"] += 1
    kinds: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    direct = 0.0  # the Python subprocesses the workers started, with their own children
    for pid, ppid, seconds, ms, _test, command in procs:
        if int(pid) in workers:
            continue
        if int(ppid) in workers:
            direct += float(seconds)
            kind = command_kind(command, ms == "1")
            kinds[kind] += float(seconds)
            counts[kind] += 1
    in_workers = sum(w["self"] for w in workers.values())
    subprocesses = sum(w["kids"] for w in workers.values())
    compile_cpu = sum(t["compile_cpu"] for t in rows)
    paths = " ".join(args.paths)
    print(
        f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, {cpu_summary()}, "
        f"`python bench/suite_cost.py{' ' + paths if paths else ''} --workers {args.workers}`\n"
    )
    print(f"pytest: {summary}; {wall:.0f} s wall, {cpu:.0f} CPU-s ({cpu / wall:.2f} cores busy on average)\n")
    total = max(cpu, 1e-9)
    print("| where the CPU went | CPU-s | share |")
    print("|---|---:|---:|")
    lines = [
        ("in the test workers", in_workers),
        (f"  of which MindSpore graph compiles ({sum(t['compiles'] for t in rows)})", compile_cpu),
        ("Python subprocesses the tests started (with their children)", direct),
        ("other programs the tests started (Lite runners, qemu, g++, pip, Chromium)", subprocesses - direct),
    ]
    for label, seconds in lines:
        print(f"| {label} | {seconds:.0f} | {seconds / total:.0%} |")
    print("\n| Python subprocess | processes | CPU-s | share |")
    print("|---|---:|---:|---:|")
    for kind, seconds in kinds.most_common():
        print(f"| {kind} | {counts[kind]} | {seconds:.0f} | {seconds / total:.1%} |")
    print("\n| test file | tests | wall s | worker CPU-s | compiles (CPU-s) | subprocess CPU-s | share of CPU |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    ranked = sorted(per_file.items(), key=lambda kv: -(kv[1]["self"] + kv[1]["kids"]))
    for name, c in ranked[: args.top]:
        print(
            f"| {name} | {c['tests']} | {c['wall']:.0f} | {c['self']:.0f} | {c['compiles']} ({c['compile_cpu']:.0f}) "
            f"| {c['kids']:.0f} | {(c['self'] + c['kids']) / total:.1%} |"
        )
    rest = ranked[args.top :]
    if rest:
        cpu_rest = sum(c["self"] + c["kids"] for _, c in rest)
        print(
            f"| {len(rest)} other files | {sum(c['tests'] for _, c in rest)} | {sum(c['wall'] for _, c in rest):.0f} "
            f"| {sum(c['self'] for _, c in rest):.0f} | | {sum(c['kids'] for _, c in rest):.0f} "
            f"| {cpu_rest / total:.1%} |"
        )


if __name__ == "__main__":
    sys.exit(main())
