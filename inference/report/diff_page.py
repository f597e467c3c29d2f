"""The page of ``python -m inference.report diff``: the outcome, the two runs side by side, and every change."""

from __future__ import annotations

import os
from html import escape
from pathlib import Path
from urllib.parse import quote

from inference.report.diff import Change, regressed, summary
from inference.report.html import document, status_class
from inference.report.reading import Run, short

EFFECT = {"regression": "fail", "improvement": "pass", "change": "warn"}


def diff_page(old: Run, new: Run, changes: list[Change], out: Path) -> str:
    line = summary(changes)
    outcome = "REGRESSED" if regressed(changes) else ("CHANGED" if changes else "EQUIVALENT")
    cls = {"REGRESSED": "fail", "CHANGED": "pass", "EQUIVALENT": "pass"}[outcome]
    head = (f'<header class="verdict {cls}"><div class="badge" id="verdict">{outcome}</div><div><h1>run comparison: '
            f"{escape(new.subject)}</h1><p>{escape(line)}</p></div></header>")  # fmt: skip
    sides = "".join(_side(label, run, out) for label, run in (("OLD", old), ("NEW", new)))
    rows = "".join(
        f'<tr class="{EFFECT[c.effect]}"><td class="st {EFFECT[c.effect]}">{escape(c.effect)}</td>'
        f"<td>{escape(c.kind)}</td><td>{escape(c.what)}</td><td>{escape(c.old)}</td><td>{escape(c.new)}</td></tr>"
        for c in changes
    )
    table = (f'<h2 id="changes">Changes <span class="muted">({sum(c.effect == "regression" for c in changes)} '
             f"regression(s), {len(changes)} in all)</span></h2>"
             '<table class="sortable"><thead><tr><th>effect</th><th>kind</th><th>what</th><th>OLD</th><th>NEW</th>'
             f"</tr></thead><tbody>{rows}</tbody></table>" if changes else
             '<h2 id="changes">Changes</h2><p>None beyond noise: the two runs are equivalent.</p>')  # fmt: skip
    note = ('<p class="muted">A metric counts as changed when it moves by more than half its old value and by more '
            "than 1% of the tolerance granted; counts (flips, differing actions, diverged episodes, elements beyond "
            "tolerance) when they differ at all.</p>")  # fmt: skip
    context = [c for c in changes if c.kind in ("provenance", "inputs")]
    differ = ('<div class="card"><b>The runs differ in</b><br>' + "<br>".join(
        f"{escape(c.what)}: <code>{escape(c.old)}</code> → <code>{escape(c.new)}</code>" for c in context) + "</div>"
        if context else '<div class="card">Same bundle, checkpoint, versions and inputs.</div>')  # fmt: skip
    body = f'{head}<main>{_lead(old, new)}<div class="grid">{sides}</div>{differ}{table}{note}</main>'
    return document(f"{outcome}: {new.subject}", body)


def _lead(old: Run, new: Run) -> str:
    """What a reader of a diff needs first: the verdict change, NEW's first failure, and each first diverging layer."""
    lines = [f'<b id="verdict-change">{escape(old.verdict_line)} → {escape(new.verdict_line)}</b>']
    first = new.first_failure()
    if first is not None:
        lines.append(
            f"NEW's first failure: <b>{escape(str(first.get('runtime')))} · {escape(str(first.get('name')))}"
            f"</b> at the {escape(new.stage_name(first))} stage: {escape(str(first.get('summary')))}"
        )
    for label, run in (("NEW", new), ("OLD", old)):
        for k, r in enumerate(x for x in run.diverging() if x["layer"]):
            head = r["row"]
            detail = (f"cosine {head['cosine']:.6f}, max abs {head.get('max_abs', 0):.3g}" if isinstance(
                head.get("cosine"), int | float) else escape(r["message"]))  # fmt: skip
            anchor = f' id="{label.lower()}-layer"' if k == 0 else ""
            lines.append(
                f"{label}: first diverging layer <b{anchor}>{escape(str(r['layer']))}</b> "
                f"({escape(str(r['kind']))}) in {escape(r['runtime'])} — {detail}"
            )
    return f'<div class="card why" id="lead">{"<br>".join(lines)}</div>'


def relative_url(path: str) -> str:
    """A file path as a relative URL, whatever its name: percent-encoded (a ``javascript:`` directory name is no URL
    scheme) and starting with ``./`` or ``../``."""
    url = quote(Path(path).as_posix())
    return url if url.startswith(("./", "../")) else f"./{url}"


def _side(label: str, run: Run, out: Path) -> str:
    d = run.data
    bundle = d.get("bundle") or {}
    first = run.first_failure()
    failing = (f"<br>first failure: {escape(str(first.get('runtime')))} {escape(str(first.get('name')))} "
               f"({escape(run.stage_name(first))})" if first else "")  # fmt: skip
    where = Path(run.where)
    page = (where if where.is_dir() else where.parent) / "report.html"
    link = ""
    if page.is_file():
        rel = os.path.relpath(page.resolve(), out.resolve().parent)
        link = f' · <a href="{escape(relative_url(rel))}">its report</a>'
    cmd = (run.provenance.get("command") or {}).get("shell")
    return (
        f'<div class="card"><h3>{label}: <span class="st {status_class(run.verdict)}">{escape(run.verdict_line)}'
        f"</span></h3><p><code>{escape(run.where)}</code>{link}<br>{escape(str(d.get('created', '')))} · bundle "
        f"<code>{escape(str(bundle.get('path')))}</code> ({escape(str(bundle.get('precision')))}, manifest "
        f"{escape(short(bundle.get('manifest_sha256')))}) · compared: {escape(', '.join(run.compared) or 'none')}"
        f"{failing}</p>{f'<pre>{escape(cmd)}</pre>' if cmd else ''}</div>"
    )
