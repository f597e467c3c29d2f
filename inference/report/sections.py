"""The evidence sections of ``report.html``: per-output statistics, where it diverges (layers), policy metrics,
episodes, the field audit over time, every check, and the runtimes not compared. Each reads the run's documents
through ``reading.Run``; charts come from ``svg``."""

from __future__ import annotations

import math
from html import escape
from typing import Any

from inference.report.reading import Run, num, slug
from inference.report.svg import PALETTE, Series, bar_chart, fmt, line_chart

MARK = {"pass": "✔", "fail": "✘", "warn": "!", "skip": "–", "error": "?"}


def evidence(run: Run) -> list[str]:
    colors = {name: PALETTE[k % len(PALETTE)] for k, name in enumerate(run.compared)}
    return [outputs(run), layers(run, colors), policy(run, colors), episodes(run, colors), audit(run),
            all_checks(run), not_compared(run)]  # fmt: skip


def td(value: Any, digits: str = "") -> str:
    """A numeric cell that sorts by its value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f'<td class="n">{escape(str(value)) if value is not None else "–"}</td>'
    v = float(value)
    text = f"{v:{digits}}" if digits and math.isfinite(v) else fmt(v)
    key = v if math.isfinite(v) else (1e308 if v > 0 else -1e308)
    return f'<td class="n" data-v="{key!r}">{text}</td>'


def table(head: list[str], rows: list[str], sortable: bool = True, scroll: bool = False) -> str:
    cls = ' class="sortable"' if sortable else ""
    out = (f"<table{cls}><thead><tr>{''.join(f'<th>{escape(h)}</th>' for h in head)}</tr></thead>"
           f"<tbody>{''.join(rows)}</tbody></table>")  # fmt: skip
    return f'<div class="scroll">{out}</div>' if scroll else out


def status_cell(status: str) -> str:
    return f'<td class="st {escape(status)}">{MARK.get(status, "")} {escape(status)}</td>'


def outputs(run: Run) -> str:
    """Per runtime and output: the error statistics and the smallest tolerance that would pass (Polygraphy's)."""
    rows, seen = [], set()
    for check, graph, output, s in run.output_rows():
        key = slug(f"out-{check.get('runtime')}-{graph}")
        rid = f' id="{key}"' if key not in seen else ""
        seen.add(key)
        status = "pass" if s.get("passed") else "fail"
        if s.get("shape_mismatch"):
            detail = f"<td colspan=10>shape {escape(str(s['shape_mismatch']))}</td>"
        elif s.get("exact"):
            detail = (f"{td(s.get('mismatches'))}<td colspan=9 class=muted>integer output: compared exactly "
                      f"({s.get('mismatches', 0)} of {s.get('count', 0)} differ)</td>")  # fmt: skip
        else:
            detail = "".join([td(s.get("mismatches")), td(s.get("max_abs")), td(s.get("p99_abs")), td(s.get("max_rel")),
                              td(s.get("p99_rel")), td(s.get("cosine"), ".9f"), td(s.get("max_ulp")),
                              td(s.get("required_atol")), td(s.get("required_rtol")),
                              f"<td>{escape(str(s.get('tolerance') or '–'))}</td>"])  # fmt: skip
        rows.append(
            f'<tr class="{status}"{rid}><td>{escape(str(check.get("runtime")))}</td><td>{escape(graph)}</td>'
            f"<td>{escape(output)}</td>{status_cell(status)}{td(s.get('count'))}{detail}</tr>"
        )
    if not rows:
        return '<h2 id="outputs">Outputs</h2><p class="muted">No output was compared.</p>'
    head = ["runtime", "graph", "output", "status", "elements", "beyond tol", "max abs", "p99 abs", "max rel",
            "p99 rel", "cosine", "max ULP", "atol that passes", "rtol that passes", "tolerance granted"]  # fmt: skip
    return (
        f'<h2 id="outputs">Outputs per runtime</h2><p class="muted">On the finite observations; an element fails '
        f"only when beyond both atol and rtol. &ldquo;atol that passes&rdquo; is the smallest atol passing every "
        f"element with rtol 0 (and the same for rtol).</p>{table(head, rows, scroll=True)}"
    )


def layers(run: Run, colors: dict[str, str]) -> str:
    locs = run.localization
    if not locs:
        return ('<h2 id="layers">Where it diverges</h2><p class="muted">No runtime was localised: layers are compared '
                "for a runtime failing at the network, precision or version stage, on an fp16 bundle's Lite, or with "
                "--localize.</p>")  # fmt: skip
    out = ['<h2 id="layers">Where it diverges</h2>']
    series, names = [], []
    for name, loc in locs.items():
        rows = loc.get("layers") or []
        first = loc.get("first_diverging_layer")
        line = (f"first diverging layer: <b>{escape(str(first))}</b> ({escape(str(loc.get('first_diverging_kind')))})"
                if first else escape(str(loc.get("message") or "no diverging layer")))  # fmt: skip
        note = f"; {escape(str(loc['message']))}" if first and loc.get("message") else ""
        if not first and not rows:
            out.append(f'<p id="{slug("layers-" + name)}"><b>{escape(name)}</b>: <span class="muted">{line}</span></p>')
            continue
        out.append(
            f'<h3 id="{slug("layers-" + name)}">{escape(name)}: {line}{note} '
            f'<span class="muted">(by {escape(str(loc.get("method", "")))})</span></h3>'
        )
        if rows:
            body = [f'<tr class="{"fail" if r.get("scope") == first else r.get("status", "")}"><td>{k}</td>'
                    f"<td>{escape(str(r.get('scope')))}</td><td>{escape(str(r.get('kind')))}</td>"
                    f"{status_cell(str(r.get('status')))}{td(r.get('cosine'), '.9f')}{td(r.get('max_abs'))}"
                    f"{td(r.get('max_rel'))}<td>{escape(str(r.get('note') or ''))}</td></tr>"
                    for k, r in enumerate(rows)]  # fmt: skip
            out.append(table(["#", "layer", "type", "status", "cosine", "max abs", "max rel", "note"], body))
        if loc.get("method") == "layer outputs" and any(r.get("max_abs") is not None for r in rows):
            if len(rows) > len(names):
                names = [str(r.get("scope")) for r in rows]
            series.append(Series(name, list(range(len(rows))), [r.get("max_abs") for r in rows],
                                 colors.get(name, PALETTE[0]), marker="o"))  # fmt: skip
    if series:
        out.append(
            '<div class="charts">'
            + line_chart(
                series,
                title="per-layer max |Δ| against the reference layer (log scale)",
                y_label="max |Δ|",
                log_y=True,
                x_names=names,
                width=900,
                height=260,
            )
            + "</div>"
        )
    return "".join(out)


def policy(run: Run, colors: dict[str, str]) -> str:
    """Flips with their margins, KL, |Δ log-prob| and the log-ratio distribution, per runtime and graph."""
    rows, flips, ratios = [], [], {}
    for c in run.checks:
        if not str(c.get("name", "")).startswith("observations."):
            continue
        m, graph, runtime = c.get("metrics") or {}, str(c["name"]).split(".", 1)[1], str(c.get("runtime"))
        f, kl, lp = m.get("flips") or {}, m.get("kl") or {}, m.get("abs_delta_log_prob") or {}
        agree = m.get("action_agreement")
        rows.append(f"<tr><td>{escape(runtime)}</td><td>{escape(graph)}</td>{td(f.get('flips'))}"
                    f"{td(f.get('explained'))}{td(f.get('rate'))}{td(f.get('max_rate'))}{td(kl.get('mean'))}"
                    f"{td(kl.get('max'))}{td(lp.get('mean'))}{td(lp.get('max'))}"
                    f"{td(agree if agree is not None else m.get('max_abs_action_diff'))}</tr>")  # fmt: skip
        for row, margin in zip(f.get("rows") or [], f.get("margins") or [], strict=False):
            flips.append(f"<tr><td>{escape(runtime)}</td><td>{escape(graph)}</td>{td(row)}{td(margin)}</tr>")
        ratio = m.get("log_ratio") or {}
        if ratio.get("count"):
            ratios.setdefault(runtime, []).append((graph, ratio))
    merged = {runtime: merge_ratios(found) for runtime, found in ratios.items()}
    equal = [f"{r} ({', '.join(g for g, _ in ratios[r])})" for r, m in merged.items() if m["zeros"] == m["count"]]
    charts = [log_ratio_chart(f"{r} ({', '.join(g for g, _ in ratios[r])})", m, colors.get(r, PALETTE[0]))
              for r, m in merged.items() if m["zeros"] != m["count"]]  # fmt: skip
    if not rows:
        return ""
    head = ["runtime", "graph", "flips", "at near-ties", "flip rate", "max rate", "KL mean", "KL max", "|Δ log p| mean",
            "|Δ log p| max", "action agreement / max |Δ action|"]  # fmt: skip
    out = [f'<h2 id="policy">Policy</h2>{table(head, rows)}']
    if flips:
        out.append(
            f"<h3>Flips and the reference's margin between the two actions (first 20 per check)</h3>"
            f"{table(['runtime', 'graph', 'row', 'score margin'], flips, scroll=True)}"
        )
    if charts or equal:
        same = (f'<p class="muted">Every sampled action has exactly the reference\'s log-probability in '
                f"{escape(', '.join(equal))}.</p>" if equal else "")  # fmt: skip
        out.append(
            "<h3>Log-ratio log p<sub>runtime</sub>(a) − log p<sub>reference</sub>(a) of the sampled actions"
            f'</h3>{same}<div class="charts">{"".join(charts)}</div>'
        )
    return "".join(out)


def merge_ratios(found: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One runtime's log-ratio histograms over its graphs as one (the bins are fixed: counts add), with the widest
    quantiles and the worst mismatch numbers of any graph."""
    if len(found) == 1:
        return found[0][1]
    first = found[0][1]
    out: dict[str, Any] = {"edges": first.get("edges") or [], "count": 0, "zeros": 0}
    for side in ("negative", "positive"):
        width = max(len(r.get(side) or []) for _, r in found)
        out[side] = [sum((r.get(side) or [])[k] if k < len(r.get(side) or []) else 0 for _, r in found)
                     for k in range(width)]  # fmt: skip
    out["count"] = sum(int(r.get("count") or 0) for _, r in found)
    out["zeros"] = sum(int(r.get("zeros") or 0) for _, r in found)
    qs = [r.get("quantiles") or {} for _, r in found]
    pick = {"p1": min, "min": min, "p99": max, "max": max}
    out["quantiles"] = {k: f(q[k] for q in qs if q.get(k) is not None) for k, f in pick.items()
                        if any(q.get(k) is not None for q in qs)}  # fmt: skip
    worst = max((r.get("mismatch") or {} for _, r in found), key=lambda m: m.get("mean_exp_abs") or 0.0)
    out["mismatch"] = worst
    return out


def log_ratio_chart(title: str, ratio: dict[str, Any], color: str) -> str:
    edges = ratio.get("edges") or []
    neg, pos = ratio.get("negative") or [], ratio.get("positive") or []
    names = [f"-{fmt(e)}" for e in edges[:-1]][::-1] + ["0"] + [fmt(e) for e in edges[:-1]]
    counts = [*neg[::-1], ratio.get("zeros", 0), *pos]
    keep = [k for k, v in enumerate(counts) if v] or [len(neg)]
    lo, hi = max(0, min(keep) - 1), min(len(counts), max(keep) + 2)
    q = ratio.get("quantiles") or {}
    caption = (
        f"{title}: {ratio.get('count')} actions, {ratio.get('zeros', 0)} exactly equal; p1 {num(q.get('p1'))},"
        f" p99 {num(q.get('p99'))}, max |·| {num(max(abs(q.get('min') or 0), abs(q.get('max') or 0)))}"
    )
    mm = ratio.get("mismatch") or {}
    if mm.get("count"):  # the mismatch numbers of these log-ratios (policy_level.mismatch)
        caption += (f"; mean exp|Δ| {num(mm.get('mean_exp_abs'))}, ESS {num(mm.get('ess'))}, "
                    f"k3 KL {num(mm.get('k3_kl'))}")  # fmt: skip
    colors = ["#adb5bd" if names[k] == "0" else color for k in range(lo, hi)]
    return bar_chart(names[lo:hi], counts[lo:hi], title=caption, x_label="log-ratio (bins of half a decade, "
                     "lower edge)", colors=colors, width=560, height=220)  # fmt: skip


def episodes(run: Run, colors: dict[str, str]) -> str:
    rows, seen, returns = [], set(), {}
    trajectory: tuple[tuple[bool, bool, bool], tuple[str, str, bool, dict[str, Any]]] | None = None
    failing = run.failing_runtimes()
    for c in run.checks:
        name = str(c.get("name", ""))
        if not name.startswith("episodes."):
            continue
        runtime, m = str(c.get("runtime")), c.get("metrics") or {}
        parts = name.split(".")  # episodes.<replay>.<mode>, or episodes.<mode>: a mode that was not played
        kind, mode = (parts[1], parts[2]) if len(parts) >= 3 else ("not played", parts[-1])
        rid = f' id="{slug("ep-" + runtime)}"' if runtime not in seen else ""
        seen.add(runtime)
        measured = (f"{m.get('differing_actions', 0)} of {m.get('steps', 0)} actions differ"
                    if kind == "teacher_forced" else f"{m.get('episodes_diverged', 0)} episode(s) diverge"
                    if kind == "free_running" else "–")  # fmt: skip
        rows.append(f'<tr class="{c.get("status")}"{rid}><td>{escape(runtime)}</td><td>{escape(mode)}</td>'
                    f"<td>{escape(kind.replace('_', '-'))}</td>{status_cell(str(c.get('status')))}<td>{measured}</td>"
                    f"{td(m.get('first_divergent_step'))}{td(m.get('max_abs_return_delta'))}"
                    f"<td>{escape(str(c.get('summary', '')))}</td></tr>")  # fmt: skip
        if kind == "free_running" and m.get("reference_returns") is not None:
            returns.setdefault(mode, {"reference": m["reference_returns"]})[runtime] = m.get("returns")
            traj = m.get("trajectory") or {}
            # the overlay shows a runtime that diverged, else one that failed elsewhere, else the last compared
            rank = (bool(m.get("episodes_diverged")), runtime in failing, mode == "deterministic")
            if traj.get("step") and (trajectory is None or rank > trajectory[0]):
                trajectory = (rank, (runtime, mode, bool(m.get("episodes_diverged")), traj))
    if not rows:
        return ""
    head = ["runtime", "mode", "replay", "status", "measured", "first divergent step", "max |Δ return|", "summary"]
    out = ['<h2 id="episodes">Episodes</h2>', table(head, rows, scroll=True), '<div class="charts">']
    for mode, by in returns.items():
        ref = by.pop("reference")
        own = {n: r for n, r in by.items() if r}
        if own and all(list(r) == list(ref) for r in own.values()):
            out.append(
                f'<p class="muted">paired episodes, {mode}: every runtime\'s {len(ref)} returns equal the '
                f"reference's, episode by episode (mean {num(sum(ref) / max(1, len(ref)))})</p>"
            )
            continue
        series = [Series("reference", list(range(len(ref))), ref, "#212529", line=False, marker="ring")]
        series += [Series(n, list(range(len(r))), r, colors.get(n, PALETTE[0]), line=False, marker="o")
                   for n, r in own.items()]  # fmt: skip
        out.append(
            line_chart(
                series,
                title=f"paired episode returns, {mode} (same env seeds and noise)",
                x_label="episode",
                y_label="return",
            )
        )
    if trajectory is not None:
        out.append(trajectory_chart(*trajectory[1], colors))
    for mode in ("deterministic", "stochastic"):
        series = [
            Series(n, d[mode].get("step") or [], d[mode].get("max") or [], colors.get(n, PALETTE[0]))
            for n, d in (run.data.get("episode_diffs") or {}).items()
            if isinstance(d, dict) and mode in d
        ]
        if not series:
            continue
        if not any(v for s in series for v in s.ys):
            out.append(f'<p class="muted">free-running, {mode}: every step of every runtime acts exactly as the '
                       "reference (max |Δ action| 0)</p>")  # fmt: skip
            continue
        values = [v for s in series for v in s.ys if v]
        log_y = max(values) / min(values) > 100  # a few decades: log; discrete actions (0 or 1 apart): linear
        out.append(
            line_chart(
                series,
                title=f"free-running, {mode}: largest |Δ action| over the episodes per step (block maxima)",
                x_label="episode step",
                y_label="max |Δ action|",
                log_y=log_y,
                y_range=None if log_y else (0.0, max(values) * 1.15),
            )
        )
    return "".join(out) + "</div>"


def trajectory_chart(runtime: str, mode: str, diverged: bool, t: dict[str, Any], colors: dict[str, str]) -> str:
    steps = t["step"]
    vlines = [(float(t["first_divergent_step"]), "first divergent step")] if t.get("first_divergent_step") else []
    what = t.get("observation") or {}
    label = f"observation[{what.get('dimension')}]" if what else "action[0]"
    what = what or t.get("action") or {}
    color = colors.get(runtime, PALETTE[0])
    series = [Series("reference", steps, what.get("reference") or [], "#212529"),
              Series(runtime, steps, what.get("runtime") or [], color, dashed=True)]  # fmt: skip
    state = "diverges" if diverged else "matches the reference"
    span = f"steps {steps[0]}–{steps[-1]} of {t.get('steps')}"
    return line_chart(
        series,
        title=f"episode {t.get('episode')} ({mode}, {span}): {label}, reference vs {runtime} ({state})",
        x_label="episode step",
        y_label=label,
        vlines=vlines,
    )


def audit(run: Run) -> str:
    """The field audit over time: the error against the tolerance and the share out of training's range per
    window, the observations' range per dimension, and the recorded returns against training's."""
    facts = run.audit
    if not run.is_audit:
        return ""
    if not facts:
        return '<h2 id="audit">Field audit</h2><p class="muted">audit.json is missing next to report.json.</p>'
    windows = [w for w in facts.get("windows") or [] if isinstance(w, dict)]
    out = [f'<h2 id="audit">Field audit</h2><p>{escape(str(facts.get("steps", "?")))} recorded steps in '
           f"{escape(str(facts.get('chunks', '?')))} chunk(s), recorded by {escape(str(facts.get('recorded_by', '?')))}"
           f"; {escape(str(facts.get('dropped_steps', 0)))} dropped.</p>"]  # fmt: skip
    if windows:
        t0 = windows[0].get("start_ns") or 0
        xs = [((w.get("end_ns") or t0) - t0) / 1e9 for w in windows]
        ratio = Series("largest error / tolerance", xs, [w.get("worst_ratio") for w in windows], PALETTE[0], marker="o")
        ood = Series("share out of range", xs, [w.get("ood_share") for w in windows], PALETTE[1], marker="o")
        out.append('<div class="charts">' + line_chart([ratio], title="error against the tolerance per time window",
                   x_label="seconds since the first recorded step", y_label="error / tolerance", log_y=True,
                   hlines=[(1.0, "tolerance")]) + line_chart([ood], title="share of steps beyond training's range "
                   "per window", x_label="seconds since the first recorded step", y_label="share",
                   hlines=[(0.01, "1%")], y_range=(0.0, max(0.05, *(w.get("ood_share") or 0 for w in windows)) * 1.1))
                   + "</div>")  # fmt: skip
        body = [
            f"<tr>{td(k)}{td(w.get('steps'))}{td(w.get('max_abs'))}{td(w.get('worst_ratio'))}"
            f"{td(w.get('mismatched_rows'))}{td(w.get('ood_share'))}</tr>"
            for k, w in enumerate(windows)
        ]
        out.append(table(["window", "steps", "max abs", "error / tolerance", "rows beyond", "share out of range"],
                         body, scroll=True))  # fmt: skip
    ood = facts.get("ood") or {}
    dims = [d for d in ood.get("per_dimension") or [] if isinstance(d, dict)]
    if dims:
        body = [
            f"<tr>{td(d.get('dimension'))}{td(d.get('mean_abs_z'))}{td(d.get('max_abs_z'))}"
            f"{td(d.get('share_beyond_sigma'))}</tr>"
            for d in dims
        ]
        out.append(
            f"<h3>Observations against training's statistics (beyond {num(ood.get('sigma'))} std: "
            f"{100 * float(ood.get('share_beyond_sigma') or 0):.2f}% of steps)</h3>"
            + table(["dimension", "mean |z|", "max |z|", "share beyond"], body)
        )
    r = facts.get("returns") or {}
    if r.get("episodes"):
        text = f"{r['episodes']} recorded episodes, return {num(r.get('mean'))} ± {num(r.get('std'))}"
        if "training_mean" in r:
            text += (
                f"; {escape(str(r.get('training_source', 'training')))}: {num(r.get('training_mean'))} ± "
                f"{num(r.get('training_std'))}"
            )
        out.append(f"<h3>Returns</h3><p>{text}</p>")
        far = [f for f in r.get("furthest") or [] if isinstance(f, dict)]
        if far:
            out.append(table(["episode", "env", "return", "minus training's mean"],
                             [f"<tr>{td(f.get('episode'))}{td(f.get('env'))}{td(f.get('return'))}"
                              f"{td(f.get('minus_training_mean'))}</tr>" for f in far]))  # fmt: skip
    return "".join(out)


def all_checks(run: Run) -> str:
    from inference.report.reading import anchor

    rows = []
    for c in run.checks:
        own = slug(f"check-{c.get('runtime')}-{c.get('name')}")
        link = anchor(c)
        diag = c.get("diagnosis") or {}
        ev = f' <a href="#{link}">evidence</a>' if link != own else ""
        rows.append(f'<tr class="{escape(str(c.get("status")))}" id="{own}"><td>{escape(str(c.get("runtime")))}</td>'
                    f"<td>{escape(str(c.get('name')))}{ev}</td>{status_cell(str(c.get('status')))}"
                    f"<td>{escape(str(c.get('summary', '')))}</td><td>{escape(str(diag.get('stage', '')))}</td>"
                    f"<td>{escape(str(diag.get('detail', '')))}</td></tr>")  # fmt: skip
    return (
        f'<h2 id="checks">All checks</h2>{table(["runtime", "check", "status", "summary", "stage", "diagnosis"], rows)}'
    )


def not_compared(run: Run) -> str:
    idle = [(n, i) for n, i in run.runtimes.items() if i.get("status") not in ("ran", "reference")]
    if not idle:
        return ""
    rows = [
        f"<tr><td>{escape(n)}</td><td>{escape(str(i.get('status')))}</td><td>{escape(str(i.get('reason', '')))}"
        "</td></tr>"
        for n, i in idle
    ]
    return f'<h2 id="idle">Runtimes not compared</h2>{table(["runtime", "status", "reason"], rows)}'
