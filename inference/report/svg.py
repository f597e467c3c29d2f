"""Inline SVG charts for the report page, drawn from numbers in Python: no script, no library, no network.

Each chart is a string of ``<svg>`` markup sized in CSS pixels; its text uses the page's font. A series is drawn
as a polyline with optional markers; a log axis drops values that are zero or negative and says so in the chart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

PALETTE = ("#1f6fb5", "#d9480f", "#2b8a3e", "#862e9c", "#e67700", "#0b7285", "#c2255c", "#5c940d")
MARGIN = (54, 16, 22, 40)  # left, right, top, bottom


@dataclass
class Series:
    name: str
    xs: Sequence[float]
    ys: Sequence[float | None]
    color: str = PALETTE[0]
    line: bool = True
    marker: str = ""  # "" none, "o" filled dot, "ring" hollow dot
    dashed: bool = False


@dataclass
class Axes:
    """Where data lands in the plot area: ``x``/``y`` map a value to a pixel (``y`` may give None: not drawable)."""

    x0: float
    x1: float
    y0: float
    y1: float
    log_y: bool
    width: int
    height: int
    notes: list[str] = field(default_factory=list)

    def x(self, v: float) -> float:
        left, right = MARGIN[0], self.width - MARGIN[1]
        return left + (right - left) * ((v - self.x0) / (self.x1 - self.x0) if self.x1 > self.x0 else 0.5)

    def y(self, v: float | None) -> float | None:
        if v is None or not math.isfinite(v) or (self.log_y and v <= 0):
            return None
        top, bottom = MARGIN[2], self.height - MARGIN[3]
        a, b, t = (math.log10(self.y0), math.log10(self.y1), math.log10(v)) if self.log_y else (self.y0, self.y1, v)
        return bottom - (bottom - top) * ((t - a) / (b - a) if b > a else 0.5)


def fmt(v: float) -> str:
    """A number for a tick or a table: short, exponent form outside [1e-3, 1e5)."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–" if v is None else str(v)
    if v == 0:
        return "0"
    if float(v).is_integer() and abs(v) < 1e7:
        return str(int(v))
    a = abs(v)
    if a >= 1e5 or a < 1e-3:
        return f"{v:.2e}".replace("e-0", "e-").replace("e+0", "e")
    return f"{v:.4g}"


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    return [round(start + k * step, 12) for k in range(int((hi - start) / step + 1e-9) + 1)]


def _log_ticks(lo: float, hi: float) -> list[float]:
    a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    every = max(1, math.ceil((b - a) / 6))
    return [10.0**k for k in range(a, b + 1, every)]


def _y_range(values: list[float], log_y: bool, hlines: Sequence[tuple[float, str]]) -> tuple[float, float]:
    pool = [v for v in values if v is not None and math.isfinite(v) and (v > 0 or not log_y)]
    pool += [h for h, _ in hlines if math.isfinite(h) and (h > 0 or not log_y)]
    if not pool:
        return (1e-12, 1.0) if log_y else (0.0, 1.0)
    lo, hi = min(pool), max(pool)
    if log_y:
        lo, hi = 10 ** math.floor(math.log10(lo)), 10 ** math.ceil(math.log10(hi))
        return (lo, hi * 10) if lo == hi else (lo, hi)
    if lo == hi:
        return lo - (abs(lo) or 1) * 0.5, hi + (abs(hi) or 1) * 0.5
    pad = (hi - lo) * 0.06
    return (lo - pad if lo < 0 or lo - pad >= 0 else 0.0), hi + pad


def line_chart(
    series: Sequence[Series], *, title: str, x_label: str = "", y_label: str = "", log_y: bool = False,
    hlines: Sequence[tuple[float, str]] = (), vlines: Sequence[tuple[float, str]] = (),
    x_names: Sequence[str] | None = None, width: int = 580, height: int = 230,
    y_range: tuple[float, float] | None = None,
) -> str:  # fmt: skip
    """Series against a shared x axis; ``hlines`` (thresholds) and ``vlines`` (events) are dashed and labelled.
    ``x_names``: categorical x (index k is named ``x_names[k]``), e.g. layers along the network."""
    xs = [x for s in series for x in s.xs]
    if x_names is not None:
        x0, x1 = -0.5, len(x_names) - 0.5
    else:
        x0, x1 = (min(xs), max(xs)) if xs else (0.0, 1.0)
        x0, x1 = (x0 - 0.5, x1 + 0.5) if x0 == x1 else (x0, x1)
    lo, hi = y_range or _y_range([y for s in series for y in s.ys], log_y, hlines)
    ax = Axes(x0, x1, lo, hi, log_y, width, height)
    out = [_frame(ax, title, x_label, y_label, x_names)]
    dropped = 0
    for s in series:
        points = [(ax.x(x), ax.y(y)) for x, y in zip(s.xs, s.ys, strict=False)]
        dropped += sum(p[1] is None for p in points)
        run: list[tuple[float, float]] = []
        segments = []
        for px, py in points:
            if py is None:
                if run:
                    segments.append(run)
                run = []
            else:
                run.append((px, py))
        if run:
            segments.append(run)
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        if s.line:
            for seg in segments:
                coords = " ".join(f"{px:.1f},{py:.1f}" for px, py in seg)
                out.append(f'<polyline points="{coords}" fill="none" stroke="{s.color}" stroke-width="1.6"{dash}/>')
        if s.marker:
            fill = s.color if s.marker == "o" else "#fff"
            out += [f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{fill}" stroke="{s.color}" stroke-width="1.4"/>'
                    for seg in segments for px, py in seg]  # fmt: skip
    for value, label in hlines:
        py = ax.y(value)
        if py is not None:
            out.append(f'<line x1="{MARGIN[0]}" x2="{width - MARGIN[1]}" y1="{py:.1f}" y2="{py:.1f}" '
                       f'stroke="#c92a2a" stroke-dasharray="6 4"/><text x="{width - MARGIN[1] - 2}" y="{py - 3:.1f}" '
                       f'text-anchor="end" class="th">{escape(label)}</text>')  # fmt: skip
    for value, label in vlines:
        px = ax.x(value)
        out.append(f'<line x1="{px:.1f}" x2="{px:.1f}" y1="{MARGIN[2]}" y2="{height - MARGIN[3]}" stroke="#868e96" '
                   f'stroke-dasharray="4 3"/><text x="{px + 3:.1f}" y="{MARGIN[2] + 10}" class="th">'
                   f"{escape(label)}</text>")  # fmt: skip
    if log_y and dropped:
        out.append(f'<text x="{width - MARGIN[1]}" y="{height - 4}" text-anchor="end" class="note">{dropped} '
                   "point(s) at 0 not drawn on the log axis</text>")  # fmt: skip
    out.append(_legend(series, width))
    return _svg(width, height, title, out)


def bar_chart(
    names: Sequence[str], counts: Sequence[float], *, title: str, x_label: str = "", y_label: str = "count",
    colors: Sequence[str] | None = None, width: int = 580, height: int = 230, log_y: bool = True,
) -> str:  # fmt: skip
    """One bar per named bin (a histogram); a log count axis by default, so a single outlier bin stays visible."""
    lo, hi = (0.5, max(1.0, max(counts, default=1)) * 2) if log_y else (0.0, max(1.0, max(counts, default=1)) * 1.1)
    ax = Axes(-0.5, len(names) - 0.5, lo, hi, log_y, width, height)
    out = [_frame(ax, title, x_label, y_label, names)]
    step = (width - MARGIN[0] - MARGIN[1]) / max(1, len(names))
    bottom = height - MARGIN[3]
    for k, c in enumerate(counts):
        top = ax.y(c) if c > 0 else None
        if top is None:
            continue
        color = (colors or PALETTE)[k % len(colors or PALETTE)] if colors else PALETTE[0]
        out.append(
            f'<rect x="{ax.x(k) - step * 0.4:.1f}" y="{top:.1f}" width="{step * 0.8:.1f}" '
            f'height="{bottom - top:.1f}" fill="{color}"><title>{escape(names[k])}: {c:g}</title></rect>'
        )
    return _svg(width, height, title, out)


def _frame(ax: Axes, title: str, x_label: str, y_label: str, x_names: Sequence[str] | None) -> str:
    w, h = ax.width, ax.height
    left, right, top, bottom = MARGIN[0], w - MARGIN[1], MARGIN[2], h - MARGIN[3]
    out = [f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" fill="#fff" stroke="#ced4da"/>']
    ticks = _log_ticks(ax.y0, ax.y1) if ax.log_y else _nice_ticks(ax.y0, ax.y1)
    for t in ticks:
        py = ax.y(t)
        if py is None or py < top - 0.5 or py > bottom + 0.5:
            continue
        label = f"1e{round(math.log10(t))}" if ax.log_y and not 1e-3 <= t <= 1e4 else fmt(t)
        out.append(f'<line x1="{left}" x2="{right}" y1="{py:.1f}" y2="{py:.1f}" stroke="#f1f3f5"/>'
                   f'<text x="{left - 4}" y="{py + 3:.1f}" text-anchor="end">{label}</text>')  # fmt: skip
    if x_names is not None:
        every = max(1, math.ceil(len(x_names) / 8))  # labels of up to ~7 characters, none overlapping
        for k in range(0, len(x_names), every):
            out.append(f'<text x="{ax.x(k):.1f}" y="{bottom + 13}" text-anchor="middle">{escape(x_names[k])}</text>')
    else:
        for t in _nice_ticks(ax.x0, ax.x1, 6):
            out.append(f'<text x="{ax.x(t):.1f}" y="{bottom + 13}" text-anchor="middle">{fmt(t)}</text>')
    out.append(f'<text x="{(left + right) / 2:.0f}" y="{h - 4}" text-anchor="middle" class="lab">{escape(x_label)}'
               f'</text><text transform="translate(11 {(top + bottom) / 2:.0f}) rotate(-90)" text-anchor="middle" '
               f'class="lab">{escape(y_label)}</text>')  # fmt: skip
    return "".join(out)


def _legend(series: Sequence[Series], width: int) -> str:
    names = [s for s in series if s.name]
    if len(names) < 2 and not any(s.dashed for s in names):
        return ""
    out, x = [], MARGIN[0] + 6
    for s in names:
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        y = MARGIN[2] + 10
        if s.line:
            out.append(f'<line x1="{x}" x2="{x + 16}" y1="{y}" y2="{y}" stroke="{s.color}" stroke-width="2"{dash}/>')
        else:
            fill = s.color if s.marker == "o" else "#fff"
            out.append(f'<circle cx="{x + 8}" cy="{y}" r="3" fill="{fill}" stroke="{s.color}" stroke-width="1.4"/>')
        out.append(f'<text x="{x + 20}" y="{y + 4}">{escape(s.name)}</text>')
        x += 28 + 6.5 * len(s.name)
    return f'<g class="legend">{"".join(out)}</g>' if x < width else ""


def _svg(width: int, height: int, title: str, parts: list[str]) -> str:
    return (f'<figure class="chart"><svg viewBox="0 0 {width} {height}" '
            f'width="{width}" height="{height}" role="img" aria-label="{escape(title)}">{"".join(parts)}</svg>'
            f"<figcaption>{escape(title)}</figcaption></figure>")  # fmt: skip
