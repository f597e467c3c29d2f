"""How heavy report.html is and how fast a browser shows it, per report directory.

For each report directory given (written by ``verify``, ``verify --audit`` or ``inference.check``): the page's size
against its report.json's (the data it is drawn from), and its load time in headless Chromium (navigation start to
the end of the load event, median of ``--repeat`` fresh browsers) against a baseline measured in the same run: a
page of the same stylesheet and script with no content. ``--screenshots DIR`` keeps a screenshot of each page's first
1280x800 screenful and of the whole page (``NAME.png``, ``NAME-full.png``; NAME is the report directory's name).

    python bench/report_page.py reports/pass reports/fail reports/audit --screenshots bench/results
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import browser  # noqa: E402 - tests/browser.py: the DevTools driver the browser test uses

from inference.report.html import document  # noqa: E402


def load_times(page: Path, repeat: int) -> tuple[list[float], browser.PageView]:
    views = [browser.open_page(page) for _ in range(repeat)]
    return [v.load_ms for v in views], views[-1]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reports", type=Path, nargs="+", help="report directories")
    p.add_argument("--repeat", type=int, default=5, help="fresh browsers per page (median load time)")
    p.add_argument("--screenshots", type=Path, help="keep screenshots here")
    args = p.parse_args()
    if browser.chromium() is None:
        print("error: no Chromium on PATH (make browser)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp) / "empty.html"
        empty.write_text(document("empty", "<main></main>"))
        base, _ = load_times(empty, args.repeat)
    baseline = statistics.median(base)
    print(f"baseline (empty page, same stylesheet and script): load {baseline:.0f} ms (median of {args.repeat})\n")
    print(
        "| report | report.json | report.html | html / json | load ms (median) | vs baseline | requests "
        "| console errors |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for report in args.reports:
        page, data = report / "report.html", report / "report.json"
        if not page.is_file():
            print(f"error: {report} has no report.html", file=sys.stderr)
            return 2
        times, view = load_times(page, args.repeat)
        median = statistics.median(times)
        if args.screenshots is not None:
            args.screenshots.mkdir(parents=True, exist_ok=True)
            (args.screenshots / f"{report.name}.png").write_bytes(view.screenshot)
            (args.screenshots / f"{report.name}-full.png").write_bytes(browser.open_page(page, full_page=True)
                                                                         .full_screenshot)  # fmt: skip
        kb_html, kb_json = page.stat().st_size / 1024, data.stat().st_size / 1024
        print(
            f"| {report.name} | {kb_json:.0f} KiB | {kb_html:.0f} KiB | {kb_html / kb_json:.2f} | {median:.0f} | "
            f"{median / baseline:.2f}x | {len(view.requests) - 1} | {len(view.console_errors)} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
