"""Precision plans on trained policies, in one run: fp32 (the baseline), fp16 all, fp16 plan, int8 weight, int8 full
with every layer lowered, and the int8 full plan, per policy.

Per row: the ``.ms`` size, Lite's batch-1 p50 latency and batch-256 observations/s on this CPU against fp32 (Lite in
this process; fp16 rows compute in fp32 here: this Lite build has no fp16 CPU kernels), the flip rate and log-ratio
summary of the lowered policy against the same graph unlowered on states the policy visits (the plan's own
measurement), the return difference of paired seeded episodes, verify's verdict under the row's bounds (exit code),
and the layers kept in fp32. The policies: trained CartPole-v1, Pendulum-v1 and BipedalWalker-v3 run directories
(trained here or given), and the bring-your-own CNN on camera frames (examples/bring-your-own/pixel, trained with
its own script).

    python bench/precision_plans.py --runs CartPole-v1=runs/cartpole,Pendulum-v1=runs/pendulum,... \\
        [--cnn] [--out reports/bench/precision_plans]

It also prints the fp32 runtimes' policy-level mismatch measured by verify (what the fp32 bounds are set from).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from inference.machine.facts import measured_here

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


def sh(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([PY, *args], capture_output=True, text=True, cwd=cwd, env=env)


def timing(path: Path, feed: list[np.ndarray], calls: int = 2000, big_calls: int = 100) -> tuple[float, float] | str:
    """Lite in this process on one ``.ms``: batch-1 p50 (µs) and batch-256 observations/s; or why it cannot load."""
    from inference.lite.inprocess import LiteModel

    try:
        model = LiteModel(path)
    except Exception as exc:  # noqa: BLE001 - a file Lite refuses is a row of the table, with the reason
        return f"Lite cannot load it: {str(exc).splitlines()[0][:90]}"
    with model:
        one = [x[:1] for x in feed]
        for _ in range(200):
            model.infer(*one)
        laps = []
        for _ in range(calls):
            start = time.perf_counter_ns()
            model.infer(*one)
            laps.append(time.perf_counter_ns() - start)
        big = [np.resize(x, (256, *x.shape[1:])) for x in feed]
        model.infer(*big)
        start = time.perf_counter()
        for _ in range(big_calls):
            model.infer(*big)
        rate = 256 * big_calls / (time.perf_counter() - start)
    return float(np.percentile(laps, 50)) / 1e3, rate


def verify(bundle: Path, report: Path, ref: list[str], cwd: Path | None, *extra: str) -> tuple[int, dict]:
    proc = sh("-m", "msrl_consistency.verify", "--bundle", str(bundle), *ref, "--out", str(report), "--quiet",
              "--observations", "4000", "--episodes", "10", *extra, cwd=cwd)  # fmt: skip
    data = json.loads((report / "report.json").read_text()) if (report / "report.json").is_file() else {}
    return proc.returncode, data


def plan(bundle: Path, out: Path, lower: str, ref: list[str], cwd: Path | None, *extra: str) -> dict:
    """The plan's manifest record, or ``{"error": ...}`` when the tool wrote none (exit and last line)."""
    proc = sh(
        "-m",
        "msrl_consistency.precision",
        "--bundle",
        str(bundle),
        *ref,
        "--lower",
        lower,
        "--out",
        str(out),
        "--force",
        "--quiet",
        "--observations",
        "4000",
        "--episodes",
        "10",
        *extra,
        cwd=cwd,
    )  # the verify's judge
    if not (out / "manifest.json").is_file():
        return {"error": f"exit {proc.returncode}: {(proc.stderr.strip().splitlines() or ['?'])[-1][:200]}"}
    return json.loads((out / "manifest.json").read_text())["plan"]


def failed_row(name: str, row: str, record: dict) -> dict:
    return {"policy": name, "row": row, "ms": None, "timing": "–", "verdict": record["error"], "kept": "–",
            "flips": "–", "ratio": "–", "ret": "–"}  # fmt: skip


def summary(ev: dict, graph: str) -> tuple[str, str, str]:
    g = ev.get(graph) or {}
    flips = f"{g['flip_rate']:.2%}" if "flip_rate" in g else "–"
    ratio = (f"{g['mean_exp_abs']:.4f} [{g.get('log_ratio_p1', 0):.1e}, {g.get('log_ratio_p99', 0):.1e}]"
             if "mean_exp_abs" in g else "–")  # fmt: skip
    ret = max((r["difference"] for r in (ev.get("returns") or {}).values()), default=None)
    return flips, ratio, f"{ret:.1%}" if ret is not None else "–"


def weight_quant_ms(bundle: Path, out: Path) -> Path:
    """The deterministic graph with every weight in int8 (Lite's weight quantization, the configuration the plan
    tool writes for ``--quantization weight``)."""
    config = out.with_suffix(".cfg")
    config.write_text(
        "[common_quant_param]\nquant_type=WEIGHT_QUANT\nbit_num=8\nmin_quant_weight_size=0\n"
        "min_quant_weight_channel=0\n"
    )
    converter = REPO / ".lite" / "bin" / "msrl-lite-convert"
    subprocess.run([str(converter), "--onnx", str(bundle / "policy.onnx"), "--out", str(out), "--config", str(config)],
                   capture_output=True, check=True)  # fmt: skip
    return out


def feeds(bundle_dir: Path) -> list[np.ndarray]:
    from inference.bundle import load_bundle
    from inference.compare.feeds import seeded_feeds

    bundle = load_bundle(bundle_dir)
    graph = bundle.mode_graph("deterministic") or bundle.graphs[0]
    f = seeded_feeds(bundle, 512, 0)
    return [x[f.finite & f.ordinary][:256] for x in f.graph_inputs(bundle, graph)]


def policy_rows(name: str, bundle: Path, ref: list[str], work: Path, cwd: Path | None, env: list[str]) -> list[dict]:
    graph = "policy"
    feed = feeds(bundle)
    rows = []
    base = timing(bundle / "policy.ms", feed)
    code, rep = verify(bundle, work / "fp32.report", ref, cwd, *env)
    rows.append(
        {
            "policy": name,
            "row": "fp32",
            "ms": bundle / "policy.ms",
            "timing": base,
            "verdict": code,
            "kept": "all",
            "flips": "–",
            "ratio": "–",
            "ret": "–",
            "fp32_policy": _fp32_mismatch(rep),
        }
    )
    code16, rep16 = verify(bundle, work / "fp16-all.report", ref, cwd, "--emulate", "fp16", *env)
    p16 = plan(bundle, work / "fp16-plan", "fp16", ref, cwd, *env)
    fp16_ms = work / "fp16-weights.ms"
    _fp16_weights(bundle, fp16_ms)
    flips, ratio, ret = summary(p16.get("all_lowered") or {}, graph)
    emulated = [c for c in rep16.get("checks", []) if c["runtime"] == "emulated-fp16" and c["status"] == "fail"]
    rows.append({"policy": name, "row": "fp16 all", "ms": fp16_ms, "timing": timing(fp16_ms, feed),
                 "verdict": 1 if emulated else (0 if code16 == 0 else code16), "kept": "none", "flips": flips,
                 "ratio": ratio, "ret": ret, "loc": (rep16.get("localization") or {}).get("emulated-fp16", {})
                 .get("first_diverging_layer")})  # fmt: skip
    if "error" in p16:
        rows.append(failed_row(name, "fp16 plan", p16))
    else:
        code, _ = verify(work / "fp16-plan", work / "fp16-plan.report", ref, cwd, *env)
        flips, ratio, ret = summary(p16["final"], graph)
        rows.append({"policy": name, "row": "fp16 plan", "ms": work / "fp16-plan" / "policy.ms",
                     "timing": timing(work / "fp16-plan" / "policy.ms", feed), "verdict": code,
                     "kept": ", ".join(p16["kept"]) or "none", "flips": flips, "ratio": ratio, "ret": ret})  # fmt: skip
    wq = weight_quant_ms(bundle, work / "int8-weight.ms")
    rows.append({"policy": name, "row": "int8 weight", "ms": wq, "timing": timing(wq, feed), "verdict": "–",
                 "kept": "none", "flips": "–", "ratio": "–", "ret": "–"})  # fmt: skip
    every = plan(bundle, work / "int8-all", "int8", ref, cwd, "--keep", "none", *env)
    if "error" in every:
        return [*rows, failed_row(name, "int8 full, all", every)]
    code, rep = verify(work / "int8-all", work / "int8-all.report", ref, cwd, *env)
    flips, ratio, ret = summary(every["final"], graph)
    named = [c["summary"] for c in rep.get("checks", []) if c["runtime"] == "lite" and c["status"] == "fail"
             and "breaks the bounds alone" in c["summary"]]  # fmt: skip
    rows.append({"policy": name, "row": "int8 full, all", "ms": work / "int8-all" / "policy.ms",
                 "timing": timing(work / "int8-all" / "policy.ms", feed), "verdict": code, "kept": "none",
                 "flips": flips, "ratio": ratio, "ret": ret,
                 "named": named[0].split("breaks the bounds alone: ")[-1] if named else None,
                 "loc": (rep.get("localization") or {}).get("lite", {}).get("first_diverging_layer")})  # fmt: skip
    p8 = plan(bundle, work / "int8-plan", "int8", ref, cwd, *env)
    if "error" in p8:
        return [*rows, failed_row(name, "int8 full plan", p8)]
    code, _ = verify(work / "int8-plan", work / "int8-plan.report", ref, cwd, *env)
    flips, ratio, ret = summary(p8["final"], graph)
    rows.append({"policy": name, "row": "int8 full plan", "ms": work / "int8-plan" / "policy.ms",
                 "timing": timing(work / "int8-plan" / "policy.ms", feed), "verdict": code,
                 "kept": ", ".join(p8["kept"]) or "none", "flips": flips, "ratio": ratio, "ret": ret})  # fmt: skip
    return rows


def _fp16_weights(bundle: Path, out: Path) -> None:
    """The deterministic graph's .ms with fp16 weights (what ``export --precision fp16`` writes)."""
    converter = REPO / ".lite" / "bin" / "msrl-lite-convert"
    subprocess.run([str(converter), "--onnx", str(bundle / "policy.onnx"), "--out", str(out), "--fp16"],
                   capture_output=True, check=True)  # fmt: skip


def _fp32_mismatch(rep: dict) -> dict:
    """The fp32 runtimes' worst policy-level numbers in verify (what the fp32 bounds are set from)."""
    worst: dict = {}
    for c in rep.get("checks", []):
        m = (c.get("metrics") or {}).get("mismatch") if c["name"].startswith("policy.") else None
        shift = ((c.get("metrics") or {}).get("mean_shift_in_std") or {}).get("p99")
        if c["name"].startswith("policy.") and shift is not None:
            worst["mean_shift_in_std"] = max(worst.get("mean_shift_in_std", 0.0), shift)
        if m and m.get("count"):
            worst["mean_exp_abs"] = max(worst.get("mean_exp_abs", 1.0), m["mean_exp_abs"])
            worst["k3_kl"] = max(worst.get("k3_kl", 0.0), m["k3_kl"])
            worst["ess"] = min(worst.get("ess", 1.0), m["ess"])
    return worst


def table(rows: list[dict]) -> str:
    lines = ["| policy | row | .ms KB | batch-1 p50 µs (vs fp32) | batch-256 obs/s (vs fp32) | flip rate | "
             "mean exp\\|Δ log π\\| [log-ratio p1, p99] | return Δ | verify | kept in fp32 |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---|"]  # fmt: skip
    base: dict = {}
    for r in rows:
        size = f"{r['ms'].stat().st_size / 1024:.1f}" if r.get("ms") and Path(r["ms"]).is_file() else "–"
        t = r["timing"]
        if r["row"] == "fp32" and isinstance(t, tuple):
            base[r["policy"]] = t
        b = base.get(r["policy"])
        if isinstance(t, tuple) and b:
            lat, rate = f"{t[0]:.1f} ({t[0] / b[0]:.2f}x)", f"{t[1]:,.0f} ({t[1] / b[1]:.2f}x)"
        else:
            lat, rate = (str(t), "–") if isinstance(t, str) else ("–", "–")
        verdict = {0: "0 (consistent)", 1: "1 (inconsistent)"}.get(r["verdict"], str(r["verdict"]))
        if r.get("named"):
            verdict += f"; names {r['named']}"
        if r.get("loc"):
            verdict += f"; first diverging layer {r['loc']}"
        lines.append(f"| {r['policy']} | {r['row']} | {size} | {lat} | {rate} | {r['flips']} | {r['ratio']} | "
                     f"{r['ret']} | {verdict} | {r['kept']} |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", required=True, help="ENV=RUN_DIR,... trained run directories (python -m "
                   "msrl_consistency.train)")  # fmt: skip
    p.add_argument("--cnn", action="store_true", help="also the bring-your-own CNN on frames (trained here)")
    p.add_argument("--out", type=Path, default=REPO / "reports" / "bench" / "precision_plans")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    started = time.perf_counter()
    for item in args.runs.split(","):
        env_id, run = item.split("=", 1)
        work = args.out / env_id
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        bundle = work / "bundle"
        proc = sh("-m", "msrl_consistency.export", "--ckpt", run, "--out", str(bundle), "--force")
        if proc.returncode:
            raise SystemExit(f"export {env_id} failed: {proc.stderr[-1500:]}")
        print(f"{env_id} ...", file=sys.stderr, flush=True)
        rows += policy_rows(env_id, bundle, ["--ckpt", run], work, None, [])
    if args.cnn:
        work = args.out / "cnn"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(REPO / "examples" / "bring-your-own" / "pixel", work)
        proc = sh("train.py", "--steps", "300", "--out", str(work), cwd=work)
        if proc.returncode:
            raise SystemExit(f"training the CNN failed: {proc.stderr[-1500:]}")
        ref = ["--cell", "policy:make_policy", "--ckpt", "policy.ckpt"]
        proc = sh("-m", "msrl_consistency.export", "--cell", "policy:make_policy", "--ckpt", "policy.ckpt",
                  "--contract", "contract.toml", "--out", "bundle", "--force", cwd=work)  # fmt: skip
        if proc.returncode:
            raise SystemExit(f"export of the CNN failed: {proc.stderr[-1500:]}")
        print("cnn ...", file=sys.stderr, flush=True)
        rows += policy_rows("CNN on frames (pixel)", work / "bundle", ref, work, work, ["--env", "pixel_env:make_env"])
    text = table(rows)
    fp32 = {r["policy"]: r["fp32_policy"] for r in rows if r.get("fp32_policy")}
    text += "\n\nfp32 runtimes in verify (worst over lite, onnxruntime, ms-graph, ms-mindir and graphs):\n\n"
    text += "\n".join(f"- {k}: mean exp|Δ log π| {v.get('mean_exp_abs', 1):.7f}, k3 KL {v.get('k3_kl', 0):.1e}, "
                      f"ESS {v.get('ess', 1):.6f}, p99 |Δ mean| / std {v.get('mean_shift_in_std', 0):.1e}"
                      for k, v in fp32.items())  # fmt: skip
    header = (
        measured_here(f"python bench/precision_plans.py {' '.join(sys.argv[1:])}")
        + f", {time.perf_counter() - started:.0f} s\n\n"
    )
    (args.out / "precision_plans.md").write_text(header + text + "\n")
    (args.out / "precision_plans.json").write_text(json.dumps(rows, default=str, indent=1))
    print(header + text)


if __name__ == "__main__":
    main()
