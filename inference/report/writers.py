"""Verify reports: report.json (schema-versioned), report.html (``inference.report.html``), report.md, junit.xml,
action-diff plot.

``report.json`` layout (schema ``msrl-consistency/verify-report`` v2)::

    {schema, schema_version, created, passed, exit_code,
     bundle: {path, env_id, precision, source, manifest_sha256, graphs: {name: contract}},
     reference, reference_episodes_by, inputs: {env, recorded_observations}, options,
     runtimes: {name: {status, versions, reason?, tolerance?}},
     checks: [{runtime, name, status, summary, metrics, diagnosis}],
     localization, provenance: {command, host, versions, seeds, checkpoint, bundle_files, precision},
     episode_diffs: {runtime: {mode: {step, max}}}}

v2 (policy contracts) added ``bundle.source``, ``bundle.graphs`` and ``inputs``; check names are
``observations.<graph>`` for every graph of the bundle.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

import numpy as np

from inference.bundle import sha256_file
from inference.bundle.files import json_default, staged_dir, write_atomic
from inference.compare.checks import REPORT_SCHEMA, REPORT_SCHEMA_VERSION, VerifyResult
from inference.compare.judge.batch_invariance import describe as describe_invariance
from inference.errors import UsageError
from inference.report.html import write_page
from inference.report.provenance import provenance


def report_dict(result: VerifyResult) -> dict[str, Any]:
    opts, bundle = result.options, result.bundle
    manifest = bundle.root / "manifest.json"
    return {
        "schema": REPORT_SCHEMA,
        "schema_version": REPORT_SCHEMA_VERSION,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "passed": result.ok,
        "exit_code": result.exit_code,
        "verdict": result.verdict_line(),
        "bundle": {
            "path": str(bundle.root),
            "env_id": bundle.env_id,
            "precision": bundle.precision,
            "target": bundle.target,
            "source": (bundle.manifest.get("source") or {}).get("kind", "msrl-trainer"),
            "manifest_sha256": sha256_file(manifest) if manifest.is_file() else None,
            "graphs": {g: bundle.contract(g).to_dict() for g in bundle.graphs},
            "defaults": bundle.defaults(),  # optional manifest fields left out, and what was assumed instead
        },
        "reference": result.reference.origin,
        "reference_episodes_by": result.reference.episodes_by,
        "inputs": result.inputs,
        "options": {
            "observations": int(len(result.reference.feeds)),
            "episodes": result.reference.episodes,
            "seed": result.reference.seed,
            "tolerance": opts.tolerance or bundle.precision,
            # what each runtime was judged as, where it is not ``tolerance``: a lowered runtime (fp16, int8)
            "judged_as": {
                name: info["precision"]["judged_as"]
                for name, info in result.runtimes.items()
                if (info.get("precision") or {}).get("judged_as") not in (None, opts.tolerance or bundle.precision)
            },
            "overrides": {k: v.to_dict() for k, v in opts.overrides.items()},
        },
        "runtimes": result.runtimes,
        "checks": [c.to_dict() for c in result.checks],
        "localization": {name: loc.to_dict() for name, loc in result.localizations.items()},
        "provenance": provenance(result),
        "episode_diffs": {
            name: {mode: block_max(diffs) for mode, diffs in modes.items()}
            for name, modes in result.episode_diffs.items()
            if modes
        },  # fmt: skip
    }


def block_max(values: np.ndarray, points: int = 150) -> dict[str, list]:
    """A per-step series thinned for the page: the largest value of each block of steps, at the block's first."""
    values = np.asarray(values, np.float64).ravel()
    starts = np.unique(np.linspace(0, len(values), min(len(values), points) + 1).astype(int))[:-1]
    peaks = np.maximum.reduceat(values, starts) if len(values) else values
    return {"step": starts.tolist(), "max": [float(f"{v:.4g}") if np.isfinite(v) else None for v in peaks]}


def markdown(result: VerifyResult) -> str:
    icon = {"pass": "✅", "fail": "❌", "warn": "⚠️", "skip": "⏭️", "error": "⛔"}
    verdict = {"CONSISTENT": "✅ ", "INCONSISTENT": "❌ "}.get(result.verdict, "⛔ ") + result.verdict_line()
    out = [
        f"# Consistency report: {_subject(result)}",
        "",
        f"**{verdict}** — bundle `{result.bundle.root}` ({result.bundle.precision}{_target_words(result)}), "
        f"reference `{result.reference.origin}`, {len(result.reference.feeds)} observations, "
        f"{result.reference.episodes} episodes, seed {result.reference.seed}.",
        "",
        "| runtime | check | status | details |",
        "|---|---|---|---|",
    ]
    for c in result.checks:
        detail = c.summary.replace("|", "\\|")
        if c.diagnosis:
            detail += f" — **{c.diagnosis['stage']}**: {c.diagnosis['detail']}"
        out.append(f"| {c.runtime} | {c.name} | {icon[c.status]} {c.status} | {detail} |")
    out += _localization_markdown(result)
    defaults = result.bundle.defaults()
    if defaults:
        out += ["", "## Manifest defaults", "", "Optional fields the manifest leaves out, and what verify assumed:", ""]
        out += [f"- `{key}`: {text}" for key, text in defaults.items()]
    out += ["", "## Runtimes", ""]
    for name, info in result.runtimes.items():
        extra = info.get("reason") or ", ".join(f"{k} {v}" for k, v in info.get("versions", {}).items())
        rules = sorted({t["rule"] for t in info.get("tolerance", {}).values() if "rule" in t})
        tolerance = f"; tolerance {' / '.join(rules)} (ordinary rows share their largest magnitude)" if rules else ""
        nan = info.get("nan_propagation") or {}
        nan_text = (f"; on the {nan['rows']} NaN observations (invalid input, not judged) "
                    f"{', '.join(nan['outputs_differing'])} differ in NaN-ness from the reference"
                    if nan.get("outputs_differing") else "")  # fmt: skip
        out.append(f"- **{name}**: {info['status']} {('— ' + extra) if extra else ''}{tolerance}{nan_text}")
        if info.get("precision"):
            p = info["precision"]
            out.append(f"  - computes in **{p['computes_in']}**, judged as {p['judged_as']}: {p['why']}")
        if info.get("reference"):
            out.append(f"  - judged against {info['reference']}")
            if p.get("bounds"):
                bars = ", ".join(f"{k} {v:g}" for k, v in p["bounds"].items() if isinstance(v, int | float))
                out.append(f"  - the verifier's {p['judged_as']} policy bounds: {bars}")
        if info.get("batch_invariance"):
            out.append(
                f"  - batch invariance ({info['batch_invariance']['rows']} rows alone vs at the first, middle "
                f"and last position of larger batches): {describe_invariance(info['batch_invariance'])}"
            )
    out += _mismatch_markdown(result)
    return "\n".join(out) + "\n"


def _target_words(result: VerifyResult) -> str:
    """ ", for ascend310, which computes in fp16" where the device computes in other than the graphs' precision."""
    target = result.bundle.target
    if target.get("computes_in") in (None, result.bundle.precision):
        return ""
    return f", for {target.get('device', '?')}, which computes in {target['computes_in']}"


def _mismatch_markdown(result: VerifyResult) -> list[str]:
    """Mismatch in policy terms, per runtime and graph: the sampled actions' log-ratio summary, ESS, k3 KL, mean
    exp|Δ log π|, flips with their upper bound (from the ``policy.<graph>`` checks, else the observations')."""
    rows = []
    for c in result.checks:
        metrics = c.metrics or {}
        if c.name.startswith("policy."):
            m, flips = metrics.get("mismatch") or {}, metrics.get("flips") or {}
            bounds = metrics.get("bounds") or {}
        elif (
            c.name.startswith("observations.")
            and (metrics.get("log_ratio") or {}).get("mismatch")
            and not any(o.runtime == c.runtime and o.name == "policy." + c.name.split(".", 1)[1] for o in result.checks)
        ):
            m, flips, bounds = metrics["log_ratio"]["mismatch"], {}, {}  # fmt: skip
        else:
            continue
        q = (metrics.get("log_ratio") or {}).get("quantiles") or {}
        cells = [f"{m['mean_exp_abs']:.6f}" if m.get("mean_exp_abs") is not None else "–",
                 f"{m['ess']:.4f}" if m.get("ess") is not None else "–",
                 f"{m['k3_kl']:.2e}" if m.get("k3_kl") is not None else "–",
                 f"{q['p1']:.1e} / {q['p99']:.1e}" if q else "–",
                 f"{flips['count']} ({flips['ucb']:.2%})" if flips else "–", bounds.get("preset", "–")]  # fmt: skip
        rows.append(f"| {c.runtime} | {c.name.split('.', 1)[1]} | {' | '.join(cells)} | {c.status} |")
    if not rows:
        return []
    return ["", "## Mismatch in policy terms", "",
            "Sampled actions' log-ratio log π_runtime(a|s) − log π_ref(a|s) on the same observations and actions; "
            "1.0 is a perfect mean exp|Δ log π|, ESS is the importance weights' normalised effective sample size.", "",
            "| runtime | graph | mean exp\\|Δ log π\\| | ESS | k3 KL | log-ratio p1 / p99 | flips (95% upper bound) | "
            "bounds | status |", "|---|---|---:|---:|---:|---:|---:|---|---|", *rows]  # fmt: skip


def _localization_markdown(result: VerifyResult) -> list[str]:
    """Per localised runtime: its first diverging layer, then the layers up to it and a few after."""
    if not result.localizations:
        return []
    out = ["", "## Where it diverges", ""]
    for loc in result.localizations.values():
        out += [f"**{loc.line()}** (by {loc.method})", ""]
        if loc.layers:
            out += ["| layer | type | status | cosine | max abs | max rel | note |", "|---|---|---|---:|---:|---:|---|"]
            for row in loc.layers:
                nums = [f"{v:.6f}" if k == 0 and v is not None else (f"{v:.2e}" if v is not None else "–")
                        for k, v in enumerate((row.cosine, row.max_abs, row.max_rel))]  # fmt: skip
                out.append(f"| {row.scope} | {row.kind} | {row.status} | {' | '.join(nums)} | {row.note} |")
            out.append("")
    return out


def plot_layer_errors(result: VerifyResult, out: Path) -> bool:
    """The per-layer error along the network, one line per localised runtime (where an error starts or grows)."""
    series = {name: loc for name, loc in result.localizations.items()
              if loc.method == "layer outputs" and any(r.max_abs is not None for r in loc.layers)}  # fmt: skip
    if not series:
        return False
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.8))
    for name, loc in series.items():
        errors = [max(r.max_abs, 1e-12) if r.max_abs is not None else np.nan for r in loc.layers]
        ax.plot(range(len(errors)), errors, marker="o", lw=1, label=name)
        ax.set_xticks(range(len(loc.layers)), [r.scope for r in loc.layers], rotation=30, ha="right", fontsize=7)
    ax.set(yscale="log", ylabel="max |Δ| vs the reference layer", title="per-layer error along the network")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, format="png", dpi=100)
    plt.close(fig)
    return True


def _subject(result: VerifyResult) -> str:
    """What was checked on: the env the episodes ran in, the recorded observations, else the bundle's env."""
    inputs = result.inputs
    return inputs.get("env") or inputs.get("recorded_observations") or result.bundle.env_id or result.bundle.root.name


def junit(result: VerifyResult) -> str:
    cases = []
    for c in result.checks:
        name = quoteattr(f"{c.runtime}.{c.name}")
        body = ""
        if c.status == "fail":
            msg = c.summary + (f" [{c.diagnosis['stage']}: {c.diagnosis['detail']}]" if c.diagnosis else "")
            body = f"<failure message={quoteattr(msg)}>{escape(json.dumps(c.metrics, default=str)[:4000])}</failure>"
        elif c.status == "skip":
            body = f"<skipped message={quoteattr(c.summary)}/>"
        elif c.status == "error":  # could not be judged: JUnit's <error>, so CI shows it as neither pass nor fail
            body = f"<error message={quoteattr(c.summary)}/>"
        # The product, not a module: the deploy side's check writes this same report.
        cases.append(f'  <testcase classname="msrl-consistency.verify" name={name}>{body}</testcase>')
    failures = sum(c.status == "fail" for c in result.checks)
    skipped = sum(c.status == "skip" for c in result.checks)
    errors = sum(c.status == "error" for c in result.checks)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<testsuite name="msrl-consistency verify" tests="{len(cases)}" failures="{failures}" errors="{errors}" '
        f'skipped="{skipped}">\n' + "\n".join(cases) + "\n</testsuite>\n"
    )


def plot_action_diffs(result: VerifyResult, out: Path) -> bool:
    """Per-step max action difference vs the reference, one line per runtime and episode mode."""
    if not any(result.episode_diffs.values()):
        return False  # no episodes were replayed (recorded observations, a golden file without traces)
    try:
        import matplotlib
    except ImportError:  # the deploy side installs without matplotlib: the other reports carry the same numbers
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for ax, mode in zip(axes, ("deterministic", "stochastic"), strict=True):
        for name, modes in result.episode_diffs.items():
            if mode in modes:
                diffs = np.maximum(np.asarray(modes[mode], np.float64), 1e-12)
                ax.plot(diffs, label=name, lw=1)
        ax.set(yscale="log", xlabel="episode step", title=f"free-running, {mode}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("max |Δ action| over episodes\n(exact 0 drawn at 1e-12)")
    for ax in axes:
        if ax.lines:
            ax.legend(fontsize=8)
    # Fixed margins: the labels are the same on every report, and tight_layout measured them for a third of the
    # verify's report time.
    fig.subplots_adjust(left=0.085, right=0.99, bottom=0.13, top=0.92, wspace=0.05)
    write_atomic(out, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)
    return True


REPORT_FILES = {"json": "report.json", "md": "report.md", "junit": "junit.xml", "plot": "action_diff.png",
                "layers": "layer_errors.png", "audit": "audit.json", "timeline": "audit_timeline.png",
                "html": "report.html"}  # fmt: skip
# A writer of one more file of the set (an audit's): given the path, returns whether it wrote it.
ExtraWriter = Callable[[Path], bool]


def check_report_dir(out: Path, files: Collection[str] = tuple(REPORT_FILES.values())) -> None:
    """Before any work: ``out`` can receive a report set of ``files`` (``UsageError`` otherwise). Nothing is created
    yet, so a run that ends without a verdict (exit 2/3/130 before the reports) leaves no empty directory behind."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is a file, not a report directory")
    if out.is_dir():
        foreign = sorted(p.name for p in out.iterdir() if p.name not in files)
        if foreign:
            raise UsageError(f"--out {out} holds other files ({', '.join(foreign[:3])}); reports replace the "
                             "directory as a whole: choose a new or empty one")  # fmt: skip
    parent = next(p for p in (out.absolute(), *out.absolute().parents) if p.exists())
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"cannot create the report directory {out}: {parent} is not writable")


def write_reports(
    result: VerifyResult, out_dir: str | Path, extra: Mapping[str, ExtraWriter] | None = None
) -> dict[str, Path]:
    """The report set, written into a temporary directory and renamed into place at once: ``out_dir`` holds a
    whole set (an earlier one replaced) or, after an interruption, the earlier set untouched. ``extra``: more files
    of the set, by their ``REPORT_FILES`` key."""
    out_dir = Path(out_dir)
    with staged_dir(out_dir) as tmp:
        paths = {k: tmp / v for k, v in REPORT_FILES.items() if k not in ("audit", "timeline") or k in (extra or {})}
        data = json.loads(json.dumps(report_dict(result), default=json_default))  # the page reads what the file says
        paths["json"].write_text(json.dumps(data, indent=2) + "\n")
        paths["md"].write_text(markdown(result))
        paths["junit"].write_text(junit(result))
        if not plot_action_diffs(result, paths["plot"]):
            paths.pop("plot")
        if not plot_layer_errors(result, paths["layers"]):
            paths.pop("layers")
        for key, writer in (extra or {}).items():
            if not writer(paths[key]):
                paths.pop(key)
        write_page(paths["html"], data, paths.get("audit"))
    return {k: out_dir / p.name for k, p in paths.items()}
