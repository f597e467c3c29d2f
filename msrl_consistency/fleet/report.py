"""A fleet audit's reports: one row per device (failing first), the fleet's distributions, and each device's evidence.

``OUT/report.json``, ``report.md``, ``report.html`` and ``junit.xml`` (one test case per device) describe the fleet;
``OUT/devices/<name>/`` holds the device's own audit report set (``--audit``'s: report.json, audit.json and, for a
device that is not consistent, report.md, report.html, junit.xml and the timeline). The set is written into a
temporary directory and renamed into place at once, as verify's is.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape, quoteattr

import numpy as np

from inference.bundle.files import json_default, staged_dir, write_json_atomic
from inference.report.writers import REPORT_FILES, report_dict, write_reports
from msrl_consistency.audit import audit_files
from msrl_consistency.fleet import CONSISTENT, FAILING, Device, exit_code

FLEET_FILES = ("report.json", "report.md", "report.html", "junit.xml", "devices")
DISTRIBUTED = ("steps", "decision_max_abs", "worst_ratio", "flip_rate", "action_mismatches", "ood_share")
SCHEMA = "msrl-consistency/fleet-report"


def device_row(device: Device) -> dict[str, Any]:
    """What the fleet table says of a device: its verdict and the audit's headline metrics."""
    row: dict[str, Any] = {"device": device.name, "status": device.status, "detail": device.detail}
    result, facts = device.result, device.facts
    if result is None or facts is None:
        return row
    graph = next(iter(result.bundle.graphs))
    checks = {c.name: c for c in result.checks}
    observed = checks.get(f"observations.{graph}")
    metrics = observed.metrics if observed else {}
    decision = result.bundle.contract(graph).action.distribution_output
    worst = max(facts.windows, key=lambda w: w.worst_ratio, default=None)
    localized = next(iter(result.localizations.values()), None)
    row.update({
        "steps": facts.steps,
        "chunks": facts.chunks,
        "recorded_by": facts.recorded_by,
        "failed_checks": [c.name for c in result.checks if c.status == "fail"],
        "decision_max_abs": ((metrics.get("outputs") or {}).get(decision) or {}).get("max_abs"),
        "worst_ratio": None if worst is None else worst.worst_ratio,
        "worst_window": None if worst is None else {"start_step": worst.start_step, "end_step": worst.end_step},
        "flip_rate": (metrics.get("flips") or {}).get("rate"),
        "action_mismatches": facts.actions.get("differ"),
        "ood_share": facts.ood.get("share_beyond_sigma") if facts.ood.get("available") else None,
        "first_diverging_layer": None if localized is None else localized.first,
        "report": f"devices/{device.name}",
    })  # fmt: skip
    return row


def distributions(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per metric, over the devices that have it: min, median, 90th percentile, max."""
    out = {}
    for key in DISTRIBUTED:
        values = np.asarray([r[key] for r in rows if r.get(key) is not None], np.float64)
        if len(values):
            out[key] = {"devices": int(len(values)), "min": float(values.min()), "p50": float(np.median(values)),
                        "p90": float(np.percentile(values, 90)), "max": float(values.max())}  # fmt: skip
    return out


def fleet_dict(devices: list[Device], subject: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """report.json: ``run`` (the engine, its workers, the retries, timings) is the only part that depends on how
    the fleet was audited."""
    rows = [device_row(d) for d in devices]
    counts: dict[str, int] = {}
    for d in devices:
        counts[d.status] = counts.get(d.status, 0) + 1
    code = exit_code(devices)
    return {
        "schema": SCHEMA,
        "schema_version": 1,
        "verdict": {0: "CONSISTENT", 1: "INCONSISTENT"}.get(code, "NOT VERIFIED"),
        "exit_code": code,
        **subject,
        "counts": counts,
        "devices": rows,
        "distributions": distributions(rows),
        "run": run,
    }


def markdown(data: dict[str, Any]) -> str:
    lines = [f"# Fleet audit: {data['verdict']}", "", f"Bundle `{data['bundle']}` against `{data['checkpoint']}`; "
             f"fleet `{data['fleet']}`: " + ", ".join(f"{n} {s}" for s, n in data["counts"].items()) + ".", "",
             "| device | verdict | steps | max abs (decision) | error / tolerance | flip rate | out of range | "
             "first diverging layer | detail |", "|---|---|---:|---:|---:|---:|---:|---|---|"]  # fmt: skip
    for r in data["devices"]:
        cells = [r["device"], r["status"], _num(r.get("steps")), _num(r.get("decision_max_abs")),
                 _num(r.get("worst_ratio")), _num(r.get("flip_rate")), _num(r.get("ood_share")),
                 r.get("first_diverging_layer") or "", r["detail"]]  # fmt: skip
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    if data["distributions"]:
        lines += ["", "| metric | devices | min | median | p90 | max |", "|---|---:|---:|---:|---:|---:|"]
        for key, d in data["distributions"].items():
            lines.append(f"| {key} | {d['devices']} | {_num(d['min'])} | {_num(d['p50'])} | {_num(d['p90'])} | "
                         f"{_num(d['max'])} |")  # fmt: skip
    run = data["run"]
    lines += ["", f"Engine {run['engine']}, {run['workers']} worker(s), {run['wall_s']:.1f} s; "
              f"{len(run['retries'])} chunk(s) judged again after a worker died."]  # fmt: skip
    return "\n".join(lines) + "\n"


def _num(v: Any) -> str:
    if v is None:
        return "–"
    return f"{v:,}" if isinstance(v, int) else f"{v:.3g}"


def page(data: dict[str, Any]) -> str:
    """A self-contained page: the table of devices, failing first, each linking to its own report."""
    head = ("device", "verdict", "steps", "max abs", "error / tolerance", "flip rate", "out of range", "layer",
            "detail")  # fmt: skip
    rows = []
    for r in data["devices"]:
        name = html.escape(r["device"])
        link = f'<a href="{html.escape(r["report"])}/report.html">{name}</a>' if r.get("report") else name
        css = "ok" if r["status"] == CONSISTENT else "bad"
        values = [r.get(k) for k in ("steps", "decision_max_abs", "worst_ratio", "flip_rate", "ood_share")]
        verdict = f'<span class="{css}">{html.escape(r["status"])}</span>'
        cells = [link, verdict, *(html.escape(_num(v)) for v in values),
                 html.escape(r.get("first_diverging_layer") or ""), html.escape(r["detail"])]  # fmt: skip
        rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>Fleet audit</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:.3em .6em;text-align:left}.ok{color:#176b2c}.bad{color:#b00020;font-weight:bold}</style></head><body>"
        f"<h1>Fleet audit: {html.escape(data['verdict'])}</h1><p>{html.escape(str(data['bundle']))} against "
        f"{html.escape(str(data['checkpoint']))}</p><table><tr>{''.join(f'<th>{h}</th>' for h in head)}</tr>"
        + "".join(rows)
        + "</table></body></html>\n"
    )


def junit(data: dict[str, Any]) -> str:
    """One test case per device: a failure for a device that is inconsistent or ran another bundle, an error for
    one that could not be judged."""
    cases, failures, errors = [], 0, 0
    for r in data["devices"]:
        body = ""
        if r["status"] in FAILING:
            failures += 1
            body = f"<failure message={quoteattr(r['status'] + ': ' + r['detail'])}>{escape(json.dumps(r))}</failure>"
        elif r["status"] != CONSISTENT:
            errors += 1
            body = f"<error message={quoteattr(r['status'] + ': ' + r['detail'])}/>"
        cases.append(f'  <testcase classname="msrl-consistency.fleet" name={quoteattr(r["device"])}>{body}</testcase>')
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<testsuite name="msrl-consistency fleet" tests="{len(cases)}" failures="{failures}" errors="{errors}">\n'
        + "\n".join(cases)
        + "\n</testsuite>\n"
    )


def write_fleet(devices: list[Device], data: dict[str, Any], out: Path) -> None:
    """The fleet's report set and every audited device's own, swapped into ``out`` at once."""
    with staged_dir(out) as tmp:
        for device in devices:
            if device.result is None or device.facts is None:
                continue
            where = tmp / "devices" / device.name
            if device.status == CONSISTENT:  # the evidence of a pass, without a page per device
                where.mkdir(parents=True)
                write_json_atomic(where / REPORT_FILES["json"], report_dict(device.result))
                write_json_atomic(where / REPORT_FILES["audit"], device.facts.to_dict())
            else:
                write_reports(device.result, where, audit_files(device.facts))
        (tmp / "report.json").write_text(json.dumps(data, indent=2, default=json_default) + "\n")
        (tmp / "report.md").write_text(markdown(data))
        (tmp / "report.html").write_text(page(data))
        (tmp / "junit.xml").write_text(junit(data))
