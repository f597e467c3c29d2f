"""Verify reports: console table, report.json (schema-versioned), report.md, junit.xml, action-diff plot.

``report.json`` layout (schema ``msrl-consistency/verify-report`` v2)::

    {schema, schema_version, created, passed, exit_code,
     bundle: {path, env_id, precision, source, manifest_sha256, graphs: {name: contract}},
     reference, reference_episodes_by, inputs: {env, recorded_observations}, options,
     runtimes: {name: {status, versions, reason?, tolerance?}},
     checks: [{runtime, name, status, summary, metrics, diagnosis}]}

v2 (policy contracts) added ``bundle.source``, ``bundle.graphs`` and ``inputs``; check names are
``observations.<graph>`` for every graph of the bundle.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

import numpy as np

from inference.bundle import sha256_file
from inference.compare.checks import REPORT_SCHEMA, REPORT_SCHEMA_VERSION, VerifyResult
from inference.files import write_atomic, write_json_atomic

STATUS_MARK = {"pass": "PASS", "fail": "FAIL", "warn": "warn", "skip": "skip"}


def report_dict(result: VerifyResult) -> dict[str, Any]:
    opts, bundle = result.options, result.bundle
    manifest = bundle.root / "manifest.json"
    return {
        "schema": REPORT_SCHEMA,
        "schema_version": REPORT_SCHEMA_VERSION,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "passed": result.ok,
        "exit_code": result.exit_code,
        "bundle": {
            "path": str(bundle.root),
            "env_id": bundle.env_id,
            "precision": bundle.precision,
            "source": (bundle.manifest.get("source") or {}).get("kind", "msrl-trainer"),
            "manifest_sha256": sha256_file(manifest) if manifest.is_file() else None,
            "graphs": {g: bundle.contract(g).to_dict() for g in bundle.graphs},
        },
        "reference": result.reference.origin,
        "reference_episodes_by": result.reference.episodes_by,
        "inputs": result.inputs,
        "options": {
            "observations": int(len(result.reference.feeds)),
            "episodes": result.reference.episodes,
            "seed": result.reference.seed,
            "tolerance": opts.tolerance or bundle.precision,
            "overrides": {k: v.to_dict() for k, v in opts.overrides.items()},
        },
        "runtimes": result.runtimes,
        "checks": [c.to_dict() for c in result.checks],
    }


def console_table(result: VerifyResult, only_failed: bool = False) -> str:
    checks = result.failed if only_failed else result.checks
    rows = [("runtime", "check", "status", "details")]
    for c in checks:
        detail = c.summary if not c.diagnosis else f"{c.summary} → {c.diagnosis['stage']}: {c.diagnosis['detail']}"
        rows.append((c.runtime, c.name, STATUS_MARK[c.status], detail))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [" | ".join(r[i].ljust(widths[i]) for i in range(3)) + " | " + r[3] for r in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths) + "-+-" + "-" * 20)
    verdict = "CONSISTENT" if result.ok else f"INCONSISTENT ({len(result.failed)} failed checks)"
    return "\n".join(lines) + f"\n\n{verdict}"


def markdown(result: VerifyResult) -> str:
    icon = {"pass": "✅", "fail": "❌", "warn": "⚠️", "skip": "⏭️"}
    verdict = "✅ consistent" if result.ok else f"❌ inconsistent: {len(result.failed)} failed check(s)"
    out = [
        f"# Consistency report: {result.bundle.env_id or result.inputs.get('env') or result.bundle.root.name}",
        "",
        f"**{verdict}** — bundle `{result.bundle.root}` ({result.bundle.precision}), "
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
    out += ["", "## Runtimes", ""]
    for name, info in result.runtimes.items():
        extra = info.get("reason") or ", ".join(f"{k} {v}" for k, v in info.get("versions", {}).items())
        out.append(f"- **{name}**: {info['status']} {('— ' + extra) if extra else ''}")
    return "\n".join(out) + "\n"


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
        cases.append(f'  <testcase classname="msrl_consistency.verify" name={name}>{body}</testcase>')
    failures = sum(c.status == "fail" for c in result.checks)
    skipped = sum(c.status == "skip" for c in result.checks)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<testsuite name="msrl-consistency verify" tests="{len(cases)}" failures="{failures}" skipped="{skipped}">\n'
        + "\n".join(cases)
        + "\n</testsuite>\n"
    )


def plot_action_diffs(result: VerifyResult, out: Path) -> bool:
    """Per-step max action difference vs the reference, one line per runtime and episode mode."""
    if not result.episode_diffs:
        return False
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
    axes[0].set_ylabel("max |Δ action| over episodes (exact 0 drawn at 1e-12)")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    write_atomic(out, lambda tmp: fig.savefig(tmp, format="png", dpi=100))
    plt.close(fig)
    return True


def write_reports(result: VerifyResult, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        k: out_dir / v
        for k, v in {"json": "report.json", "md": "report.md", "junit": "junit.xml", "plot": "action_diff.png"}.items()
    }
    write_json_atomic(paths["json"], report_dict(result))
    md, xml = markdown(result), junit(result)
    write_atomic(paths["md"], lambda tmp: tmp.write_text(md))
    write_atomic(paths["junit"], lambda tmp: tmp.write_text(xml))
    if not plot_action_diffs(result, paths["plot"]):
        paths.pop("plot")
    return paths
