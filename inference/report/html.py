"""``report.html``: one self-contained page per run, read from the run's report.json (and audit.json).

Top to bottom: the verdict with what failed, where (runtime and stage) and the first diverging layer; the stage
strip (Cell → MindIR → ONNX → .ms → runtime); every gate's value against its threshold; provenance; then the
evidence (``sections``). No external script, style, font or image: charts are inline SVG, the few lines of
script sort tables, and a Content-Security-Policy forbids the page any request.
"""

from __future__ import annotations

import base64
import hashlib
from html import escape
from pathlib import Path
from typing import Any

from inference.report import sections
from inference.report.reading import Run, num, read_json, short, slug

MARK = {"pass": "✔", "fail": "✘", "warn": "!", "skip": "–", "error": "?"}

STYLE = """
*{box-sizing:border-box}body{margin:0;font:13px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;
color:#212529;background:#f8f9fa}main{max-width:1240px;margin:0 auto;padding:0 16px 40px}
header.verdict{padding:12px 20px;color:#fff;display:flex;gap:18px;align-items:center}
header.pass{background:#2b8a3e}header.fail{background:#c92a2a}header.error{background:#e67700}
header .badge{font-size:26px;font-weight:700;letter-spacing:.5px}header h1{font-size:16px;margin:0;font-weight:600}
header p{margin:2px 0 0;opacity:.92}
h2{font-size:16px;margin:22px 0 8px;border-bottom:1px solid #dee2e6;padding-bottom:3px}
h3{font-size:14px;margin:14px 0 6px}
.card{background:#fff;border:1px solid #dee2e6;border-radius:6px;padding:10px 14px;margin:10px 0}
.why{border-left:5px solid #c92a2a}.why.error{border-left-color:#e67700}.why p{margin:3px 0}
.row{display:flex;gap:8px}.row .k{flex:0 0 170px;color:#495057;font-weight:600}
.strip{display:flex;align-items:stretch;gap:0;margin:10px 0}
.stage{flex:1;padding:6px 10px;border:1px solid #ced4da;background:#fff;position:relative;min-height:52px}
.stage+.stage{margin-left:18px}.stage+.stage:before{content:"→";position:absolute;left:-15px;top:14px;color:#868e96}
.stage b{display:block}.stage small{color:#495057}.stage.pass{background:#ebfbee;border-color:#8ce99a}
.stage.fail{background:#fff5f5;border-color:#ff8787}.stage.warn{background:#fff9db;border-color:#ffe066}
.stage.error{background:#fff4e6;border-color:#ffa94d}.stage.skip{background:#f1f3f5;color:#868e96}
.stage.first{outline:3px solid #c92a2a}.stage .tag{font-size:11px;color:#c92a2a;font-weight:700}
table{border-collapse:collapse;width:100%;background:#fff;font-size:12px}
th,td{border:1px solid #e9ecef;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f1f3f5;position:sticky;top:0}th.sort{cursor:pointer}th.sort:after{content:" ⇅";color:#adb5bd}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.fail td{background:#fff5f5}tr.warn td{background:#fff9db}tr.error td{background:#fff4e6}
.st{font-weight:700;white-space:nowrap}.st.pass{color:#2b8a3e}.st.fail{color:#c92a2a}.st.warn{color:#e67700}
.st.error{color:#d9480f}.st.skip{color:#868e96}
.scroll{overflow-x:auto;border:1px solid #dee2e6}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:10px}
dl{margin:0;display:grid;grid-template-columns:170px 1fr;gap:2px 10px}
dt{color:#495057;font-weight:600}dd{margin:0;word-break:break-all}
code,pre{font:12px/1.4 ui-monospace,"DejaVu Sans Mono",monospace}
pre{white-space:pre-wrap;word-break:break-all;background:#f1f3f5;padding:6px 8px;border-radius:4px;margin:2px 0}
.charts{display:flex;flex-wrap:wrap;gap:10px}figure.chart{margin:0;background:#fff;border:1px solid #dee2e6;padding:4px}
figure.chart figcaption{font-size:12px;color:#495057;padding:0 4px 2px}
svg text{font-size:10px;fill:#495057}svg text.lab{font-size:11px}svg text.th{fill:#c92a2a}svg text.note{fill:#868e96}
.muted{color:#868e96}a{color:#1864ab}
"""

SCRIPT = """
document.querySelectorAll('table.sortable').forEach(function(t){t.querySelectorAll('th').forEach(function(h,i){
h.classList.add('sort');h.addEventListener('click',function(){var b=t.tBodies[0],r=Array.from(b.rows),
d=h.dataset.dir==='asc'?-1:1;h.dataset.dir=d>0?'asc':'desc';r.sort(function(x,y){var a=x.cells[i],c=y.cells[i],
p=a.dataset.v,q=c.dataset.v;if(p!==undefined&&q!==undefined)return d*(parseFloat(p)-parseFloat(q));
return d*a.textContent.localeCompare(c.textContent);});r.forEach(function(x){b.appendChild(x);});});});});
"""
# The page's one script is allowed by its hash, nothing else: no inline handler, no javascript: URL, no other script
# (a run directory's name that reaches a link cannot run code).
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src "
    f"'sha256-{base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()}'"
)


def write_page(path: Path, data: dict[str, Any], audit_path: Path | None = None) -> None:
    """``report.html`` from the report's data (what report.json holds) and, for audits, audit.json."""
    audit = read_json(audit_path, "audit facts") if audit_path is not None and audit_path.is_file() else None
    try:
        text = page(Run(data, audit if isinstance(audit, dict) else None))
    except Exception as exc:  # noqa: BLE001 - a page that cannot be drawn never costs the run its verdict or reports
        text = document("report.html could not be drawn", f"<main><h1>{escape(str(data.get('verdict', '')))}</h1>"
                        f"<p>This page could not be drawn ({escape(type(exc).__name__)}: {escape(str(exc))}); "
                        "report.json and report.md next to it hold the whole result.</p></main>")  # fmt: skip
    path.write_text(text, encoding="utf-8")  # inside write_reports' temporary directory: the set is renamed at once


def page(run: Run) -> str:
    title = f"{run.verdict}: {run.subject}"
    evidence = sections.evidence(run)
    if run.is_audit:  # an audit's own evidence (the timeline) before the provenance
        evidence.insert(0, evidence.pop(evidence.index(sections.audit(run))))
        body = [header(run), "<main>", failure_card(run), strip(run), gates(run), evidence[0], provenance(run),
                *evidence[1:], "</main>"]  # fmt: skip
    else:
        body = [header(run), "<main>", failure_card(run), strip(run), gates(run), provenance(run), *evidence, "</main>"]
    return document(title, "".join(body))


def document(title: str, body: str) -> str:
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta http-equiv="Content-Security-Policy" '
            f'content="{CSP}"><meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>{body}"
            f"<script>{SCRIPT}</script></body></html>\n")  # fmt: skip


def status_class(verdict: str) -> str:
    return {"CONSISTENT": "pass", "INCONSISTENT": "fail"}.get(verdict, "error")


def header(run: Run) -> str:
    d = run.data
    bundle, opts = d.get("bundle") or {}, d.get("options") or {}
    kind = "field audit" if run.is_audit else "consistency report"
    what = (
        f"{escape(run.subject)} · bundle <code>{escape(str(bundle.get('path', '?')))}</code> "
        f"({escape(str(bundle.get('precision', '?')))}) against {escape(str(d.get('reference', '?')))}"
    )
    counts = f"{opts.get('observations', '?')} observations, {opts.get('episodes', '?')} episodes per mode"
    target = bundle.get("target") or {}
    if target.get("computes_in") not in (None, bundle.get("precision")):
        what += f" for {escape(str(target.get('device', '?')))}, which computes in {escape(str(target['computes_in']))}"
    lowered = "".join(f"; {escape(str(p))} for {escape(str(n))}" for n, p in (opts.get("judged_as") or {}).items())
    if run.is_audit:
        counts = f"{(run.audit or {}).get('steps', opts.get('observations', '?'))} recorded steps"
    return (
        f'<header class="verdict {status_class(run.verdict)}"><div class="badge" id="verdict">{run.verdict}</div>'
        f"<div><h1>{kind}: {what}</h1><p>{escape(run.verdict_line)} · exit {escape(str(d.get('exit_code')))} · "
        f"{escape(counts)}, seed {escape(str(opts.get('seed', '?')))}, tolerance "
        f"{escape(str(opts.get('tolerance', '?')))}{lowered} · {escape(str(d.get('created', '')))}</p></div>"
        "</header>"
    )


def failure_card(run: Run) -> str:
    """What failed, where, and the first diverging layer: the first things a reader of a failing run needs."""
    first = run.first_failure()
    field = audit_line(run) + warnings_line(run)
    if first is None:
        compared = ", ".join(run.compared) or "none"
        return (
            f'<div class="card"><p>Every check passed or was allowed. Runtimes compared against '
            f"{escape(str(run.data.get('reference')))}: <b>{escape(compared)}</b>.</p>{field}"
            f"{layers_line(run)}</div>"
        )
    failing = run.failing_runtimes()
    diag = first.get("diagnosis") or {}
    kind = "fail" if first.get("status") == "fail" else "error"
    lines = [row("First failure", f'<b id="first-failure">{escape(str(first.get("runtime")))} · '
                 f"{escape(str(first.get('name')))}</b> at the <b>{escape(run.stage_name(first))}</b> stage (pipeline "
                 f"step {escape(str(run.stage_of(first) or '–'))}): {escape(str(first.get('summary')))}"
                 f"{' — ' + escape(str(diag.get('detail'))) if diag.get('detail') else ''} "
                 f'<a href="#{run_anchor(first)}">evidence</a>')]  # fmt: skip
    runtimes = []
    for name, checks in failing.items():
        stages = sorted({run.stage_name(c) for c in checks})
        runtimes.append(f"<b>{escape(name)}</b> ({len(checks)} check(s); stage {escape(', '.join(stages))})")
    lines.append(row("Failing runtimes", "; ".join(runtimes)))
    lines.append(layers_line(run, failing=True))
    lines.append(field)
    return f'<div class="card why {kind}">{"".join(lines)}</div>'


def warnings_line(run: Run) -> str:
    """The warnings (allowed, but worth a look), the first three in full."""
    warned = [c for c in run.checks if c.get("status") == "warn"]
    if not warned:
        return ""
    items = [f'<a href="#{run_anchor(c)}">{escape(str(c.get("runtime")))} · {escape(str(c.get("name")))}</a>: '
             f"{escape(str(c.get('summary', '')))}" for c in warned[:3]]  # fmt: skip
    more = f"<br>+{len(warned) - 3} more in the gates below" if len(warned) > 3 else ""
    return row(f"Warnings ({len(warned)})", "<br>".join(items) + more)


def audit_line(run: Run) -> str:
    """An audit's facts at a glance: what was recorded, the worst window against the tolerance, the share of steps
    out of training's range."""
    facts = run.audit
    if not facts:
        return ""
    windows = [w for w in facts.get("windows") or [] if isinstance(w, dict)]
    worst = max((float(w.get("worst_ratio") or 0) for w in windows), default=0.0)
    ood = facts.get("ood") or {}
    share = (f"{100 * float(ood.get('share_beyond_sigma') or 0):.2f}% of steps beyond {num(ood.get('sigma'))} "
             "training std" if ood.get("available") else "observation range not measured")  # fmt: skip
    return row(
        "Field recording",
        f"{escape(str(facts.get('steps', '?')))} steps recorded by "
        f"<b>{escape(str(facts.get('recorded_by', '?')))}</b> in {escape(str(facts.get('chunks', '?')))} "
        f"chunk(s); worst of {len(windows)} time windows at {num(worst)} of the tolerance; {share} "
        '<a href="#audit">timeline</a>',
    )


def row(label: str, content: str) -> str:
    """A labelled line of the summary card (``content`` is markup)."""
    return f'<p class="row"><span class="k">{escape(label)}</span><span>{content}</span></p>'


def run_anchor(check: dict[str, Any]) -> str:
    from inference.report.reading import anchor

    return anchor(check)


def layers_line(run: Run, failing: bool = False) -> str:
    """The first diverging layer of each localised runtime, or why none was named."""
    rows = run.diverging()
    if not rows:
        if not failing:
            return ""
        why = ("no runtime was localised (layers are compared for failures at the network, precision or version "
               "stage, or with --localize)")  # fmt: skip
        return row("First diverging layer", f'<span class="muted">{why}</span>')
    named = [r for r in rows if r["layer"]]
    if named:
        parts = [f'<b id="first-layer">{escape(str(named[0]["layer"]))}</b> ({escape(str(named[0]["kind"]))})']
        for r in named:
            head = r["row"]
            detail = (
                f"cosine {head.get('cosine', 0):.6f}, max abs {num(head.get('max_abs'))}, max rel "
                f"{num(head.get('max_rel'))}"
                if head.get("cosine") is not None
                else escape(r["message"])
            )
            parts.append(
                f"<br>{escape(r['runtime'])}: {escape(str(r['layer']))} — {detail}"
                f"{'; ' + escape(r['message']) if r['message'] and head.get('cosine') is not None else ''}"
            )
        parts.append(' <a href="#layers">layers</a>')
        return row("First diverging layer", "".join(parts))
    msgs = "; ".join(f"{escape(r['runtime'])}: {escape(r['message'])}" for r in rows[:3])
    return row("Layers", f'<span class="muted">{msgs}</span> <a href="#layers">layers</a>')


def strip(run: Run) -> str:
    boxes = []
    for s in run.stages():
        idle = {"precision": "no lowered runtime ran (verify --emulate fp16, a precision plan)",
                "runtime": "no failure blamed on a runtime itself"}.get(s.name, "not compared")  # fmt: skip
        who = escape(", ".join(s.runtimes)) if s.runtimes else idle
        if s.failing:
            who += f"<br>fails: {escape(', '.join(s.failing[:3]))}{' …' if len(s.failing) > 3 else ''}"
        tag = '<div class="tag">first failure</div>' if s.first_failure else ""
        boxes.append(
            f'<div class="stage {s.status}{" first" if s.first_failure else ""}"><b>{MARK.get(s.status, "")}'
            f" {escape(s.name)}</b><small>{who}</small>{tag}</div>"
        )
    return f'<div class="strip" id="stages">{"".join(boxes)}</div>'


def gates(run: Run) -> str:
    rows = sorted(run.gates(), key=lambda g: {"fail": 0, "error": 1, "warn": 2}.get(g.status, 3))
    body = "".join(
        f'<tr class="{g.status}"><td>{escape(g.runtime)}</td><td><a href="#{g.anchor}">{escape(g.check)}</a></td>'
        f'<td class="st {g.status}">{MARK.get(g.status, "")} {g.status}</td><td>{escape(g.measured)}</td>'
        f"<td>{escape(g.threshold)}</td></tr>"
        for g in rows
    )
    passed = sum(g.status == "pass" for g in rows)
    return (
        f'<h2 id="gates">Gates <span class="muted">({passed} of {len(rows)} pass)</span></h2><div class="scroll">'
        f'<table class="sortable"><thead><tr><th>runtime</th><th>check</th><th>status</th><th>measured</th>'
        f"<th>threshold</th></tr></thead><tbody>{body}</tbody></table></div>"
    )


def provenance(run: Run) -> str:
    d, p = run.data, run.provenance
    bundle = d.get("bundle") or {}
    cmd = p.get("command") or {}
    ckpt = p.get("checkpoint") or {}
    versions = p.get("versions") or {}
    left = [("command", f"<pre>{escape(cmd['shell'])}</pre>" if cmd.get("shell") else
             '<span class="muted">not recorded (a library call, or a report written before commands were '
             "recorded)</span>"),
            ("bundle", f"<code>{escape(str(bundle.get('path')))}</code>, {escape(str(bundle.get('env_id')))}, "
             f"{escape(str(bundle.get('precision')))}, from {escape(str(bundle.get('source')))}"),
            ("manifest sha256", f"<code>{escape(str(bundle.get('manifest_sha256')))}</code>")]  # fmt: skip
    if ckpt.get("sha256") or ckpt.get("exported_from_sha256"):
        same = ckpt.get("sha256") == ckpt.get("exported_from_sha256")
        note = "" if not ckpt.get("sha256") else (" (the one the bundle was exported from)" if same else
                                                  " <b>≠ the bundle's</b>")  # fmt: skip
        left.append(
            (
                "checkpoint",
                f"<code>{escape(str(ckpt.get('path') or ckpt.get('exported_from')))}</code> "
                f"<code>{escape(short(ckpt.get('sha256') or ckpt.get('exported_from_sha256'), 16))}</code>{note}",
            )
        )
    if p.get("bundle_files"):
        left.append(("graph files", "<br>".join(f"{escape(k)} <code>{escape(short(v, 16))}</code>"
                                                for k, v in p["bundle_files"].items())))  # fmt: skip
    right = [
        (
            "precision",
            "<br>".join(
                f"{escape(k)}: {escape(v)}"
                for k, v in (p.get("precision") or {}).items()
                if k in run.runtimes and run.runtimes[k].get("status") in ("ran", "reference")
            ),
        )
    ]
    exporter = versions.get("exporter") or {}
    vers = [
        f"exporter: MindSpore {exporter.get('mindspore', '?')}, ONNX {exporter.get('onnx', '–')}, Lite SDK "
        f"{exporter.get('lite_sdk', '–')}, MindIR v{exporter.get('mind_ir_version', '?')}"
    ]
    for name, v in (versions.get("runtimes") or {}).items():
        vers.append(f"{name}: " + ", ".join(f"{k} {val}" for k, val in (v or {}).items()))
    host = p.get("host") or {}
    if host:
        vers.append("this box: " + ", ".join(f"{k} {v}" for k, v in host.items()))
    if "cann" not in host:
        vers.append("CANN: not installed here")
    right.append(("versions", "<br>".join(escape(v) for v in vers)))
    seeds = p.get("seeds") or {}
    train = ((seeds.get("bundle") or {}).get("train") or {}) if isinstance(seeds.get("bundle"), dict) else {}
    right.append(
        (
            "seeds",
            f"verify {escape(str(seeds.get('verify', (d.get('options') or {}).get('seed'))))}"
            + (f"; training {escape(str(train.get('seed')))}" if train.get("seed") is not None else "")
            + (
                f"; bundle self-check {escape(str(seeds['bundle'].get('self_check')))}"
                if isinstance(seeds.get("bundle"), dict) and "self_check" in seeds["bundle"]
                else ""
            ),
        )
    )
    if p.get("device"):
        right.append(("device", escape(str(p["device"]))))

    def dl(items: list[tuple[str, str]]) -> str:
        return "<dl>" + "".join(f"<dt>{escape(k)}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"

    return (
        f'<h2 id="provenance">Provenance</h2><div class="grid"><div class="card">{dl(left)}</div>'
        f'<div class="card">{dl(right)}</div></div>'
    )


def check_id(check: dict[str, Any]) -> str:
    return slug(f"check-{check.get('runtime')}-{check.get('name')}")
