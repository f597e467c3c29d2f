"""report.html and ``python -m inference.report diff``, on real runs and as a person opens them: headless Chromium
loads the page from a file URL with the network closed (``browser.py``); the verdict, the failing runtime and stage
and the first diverging layer must be in the first 1280x800 screenful; no request may leave the page and no console
error may appear. Screenshots land in pytest's temporary directory (``browser/`` under the run's base temp, kept for the
last runs), never in the checkout."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from html import escape
from pathlib import Path

import browser
import lite_build
import pytest
from cli_inprocess import run_module

from inference.report.html import page
from inference.report.reading import Run, load_run

SMALL = ["--episodes", "3"]


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600, cwd=cwd)


def verify(bundle: Path, ckpt: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_module("msrl_consistency.verify", "--bundle", str(bundle), "--ckpt", str(ckpt), "--out", str(out),
                      "--quiet", *SMALL, *extra)  # fmt: skip


def nudged_run(ckpt: Path, out: Path) -> Path:
    """A copy of the run dir whose checkpoint has one weight of the second hidden layer moved by 1e-2."""
    import mindspore as ms

    shutil.copytree(ckpt.parent, out)
    params = ms.load_checkpoint(str(ckpt))
    weight = params["actor.layers.2.weight"].asnumpy()
    weight.flat[0] += 1e-2
    params["actor.layers.2.weight"].set_data(ms.Tensor(weight))
    ms.save_checkpoint([{"name": k, "data": v} for k, v in params.items()], str(out / ckpt.name))
    return out / ckpt.name


@pytest.fixture(scope="module")
def runs(cartpole_bundle, cartpole_ckpt, tmp_path_factory) -> dict[str, Path]:
    """Real verifies of one bundle: passing (10k observations, twice) and against a nudged checkpoint (localised)."""
    root = tmp_path_factory.mktemp("report-runs")
    out = {"pass": root / "pass", "again": root / "again", "fail": root / "fail"}
    for name in ("pass", "again"):
        proc = verify(cartpole_bundle.root, cartpole_ckpt, out[name])
        assert proc.returncode == 0, proc.stderr[-2000:]
    proc = verify(cartpole_bundle.root, nudged_run(cartpole_ckpt, root / "nudged"), out["fail"], "--localize",
                  "--observations", "2000")  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    return out


@pytest.mark.slow
def test_report_html_is_one_small_self_contained_file_with_provenance(runs):
    html = (runs["pass"] / "report.html").read_text()
    assert len(html.encode()) < 2 * 1024 * 1024  # a 10k-observation verify: no per-row data on the page
    # Nothing to fetch: no external script, style, font or image, and a policy that forbids any request.
    for ref in ("http://", "https://", "src=", "<link", "@import", "url("):
        assert ref not in html, ref
    assert "default-src 'none'" in html and html.count("<script>") == 1 and "<svg" in html
    assert "max-height" not in html  # every gate and every row shows: no table in a small inner scroll pane
    report = json.loads((runs["pass"] / "report.json").read_text())
    prov = report["provenance"]
    argv = prov["command"]["argv"]
    assert argv[1:3] == ["-m", "msrl_consistency.verify"] and str(runs["pass"]) in argv
    assert prov["checkpoint"]["sha256"] == prov["checkpoint"]["exported_from_sha256"]
    assert prov["precision"]["onnxruntime"].startswith("fp32") and prov["seeds"]["verify"] == 0
    assert prov["versions"]["runtimes"]["onnxruntime"]["onnxruntime"]
    assert escape(prov["command"]["shell"]) in html  # the exact command to reproduce it is on the page


@pytest.mark.slow
def test_diff_names_the_nudged_checkpoint_and_passes_two_equal_runs(runs, tmp_path):
    proc = cli("-m", "inference.report", "diff", str(runs["pass"]), str(runs["fail"]), "--out",
               str(tmp_path / "d.html"), "--json", str(tmp_path / "d.json"))  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    first = proc.stdout.splitlines()[0]
    assert first.startswith("REGRESSED") and "checkpoint:" in first, first
    changes = json.loads((tmp_path / "d.json").read_text())["changes"]
    regressions = {(c["kind"], c["what"]) for c in changes if c["effect"] == "regression"}
    assert ("verdict", "verdict") in regressions and ("check", "bundle provenance") in regressions
    assert any(kind == "metric" and what.startswith("lite ") for kind, what in regressions), regressions
    page = (tmp_path / "d.html").read_text()
    assert "REGRESSED" in page
    lead = page[page.index('id="lead"') : page.index('<div class="grid">')]  # first, before the two runs
    assert "CONSISTENT → INCONSISTENT" in lead and "NEW's first failure" in lead, lead
    assert 'id="new-layer"' in lead and load_run(runs["fail"]).diverging()[0]["layer"] in lead, lead
    same = cli("-m", "inference.report", "diff", str(runs["pass"]), str(runs["again"] / "report.json"), "--out",
               str(tmp_path / "same.html"))  # fmt: skip
    assert same.returncode == 0 and same.stdout.startswith("EQUIVALENT"), same.stdout + same.stderr
    back = cli("-m", "inference.report", "diff", str(runs["fail"]), str(runs["pass"]), "--out",
               str(tmp_path / "b.html"))  # fmt: skip
    assert back.returncode == 0 and back.stdout.startswith("CHANGED, no regression"), back.stdout


@pytest.mark.slow
def test_diff_names_what_an_fp16_bundle_changes(runs, cartpole_ckpt, tmp_path):
    from msrl_consistency.api import export_run
    from msrl_consistency.artifacts.bundle import ExportOptions

    fp16 = export_run(cartpole_ckpt, tmp_path / "fp16", ExportOptions(precision="fp16"))
    proc = verify(fp16.root, cartpole_ckpt, tmp_path / "r16", "--observations", "2000")
    assert proc.returncode == 0, proc.stderr[-2000:]
    diff = cli("-m", "inference.report", "diff", str(runs["pass"]), str(tmp_path / "r16"), "--json",
               str(tmp_path / "d.json"), "--out", str(tmp_path / "d.html"))  # fmt: skip
    assert diff.returncode == 1, diff.stdout + diff.stderr  # ONNX Runtime no longer compared; errors x1000
    changes = json.loads((tmp_path / "d.json").read_text())["changes"]
    said = {(c["what"], c["old"], c["new"]) for c in changes}
    assert ("bundle precision", "fp32", "fp16") in said and ("tolerance preset", "fp32", "fp16") in said
    assert any(c["what"] == "onnxruntime no longer compared" and c["effect"] == "regression" for c in changes)
    assert "bundle precision: fp32 → fp16" in diff.stdout.splitlines()[0]


@pytest.fixture(scope="module")
def chromium() -> str:
    """The browser, before any run is made: under CI (``MSRL_REQUIRE_RUNNER=1``) a missing one fails the test."""
    binary = browser.chromium()
    if binary is None:
        why = "Chromium is not installed (make browser, or set MSRL_CHROMIUM)"
        if lite_build.required():
            pytest.fail(f"the browser test is required here (CI / MSRL_REQUIRE_RUNNER=1): {why}")
        pytest.skip(why)
    return binary


@pytest.mark.slow
@pytest.mark.parametrize("which", ["pass", "fail"])
def test_page_in_headless_chromium(chromium, runs, which, tmp_path_factory):
    """As a person opens a CI artifact: from a file URL, offline; the first screenful says what a reader needs."""
    view = browser.open_page(runs[which] / "report.html")
    shots = tmp_path_factory.getbasetemp() / "browser"
    shots.mkdir(parents=True, exist_ok=True)
    (shots / f"report-{which}.png").write_bytes(view.screenshot)
    (shots / f"report-{which}.json").write_text(
        json.dumps(
            {"load_ms": view.load_ms, "requests": view.requests, "console_errors": view.console_errors}, indent=2
        )
    )
    assert view.requests == [view.url], view.requests  # the page itself, nothing else
    assert view.console_errors == []
    assert view.screenshot[:8] == b"\x89PNG\r\n\x1a\n"
    screen = view.first_screen
    if which == "pass":
        assert "CONSISTENT" in screen and "INCONSISTENT" not in screen
        return
    assert "INCONSISTENT" in screen
    run = load_run(runs["fail"])
    first, layer = run.first_failure(), run.diverging()[0]
    assert f"{first['runtime']} · {first['name']}" in screen and run.stage_name(first) in screen
    for name in run.failing_runtimes():
        assert name in screen, name
    assert layer["layer"] and f"{layer['runtime']}: {layer['layer']}" in screen, screen


def test_diff_refuses_what_is_not_a_run(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "other.json").write_text('{"schema": "msrl-consistency/baseline"}')
    (tmp_path / "broken.json").write_text("{")
    for old, why in (("missing", "no report at"), ("empty", "holds no report.json"),
                     ("other.json", "is not a verify report"), ("broken.json", "is not valid JSON")):  # fmt: skip
        proc = cli("-m", "inference.report", "diff", str(tmp_path / old), str(tmp_path / old), cwd=tmp_path)
        assert proc.returncode == 2 and why in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
        assert not (tmp_path / "diff.html").exists()


def test_audit_section_reads_audit_json_and_tolerates_new_fields():
    """The audit's facts come from audit.json as written; fields added later are ignored, missing ones skipped."""
    data = {"schema": "msrl-consistency/verify-report", "exit_code": 0, "bundle": {"env_id": "CartPole-v1"},
            "runtimes": {"field:lite": {"status": "ran"}}, "options": {"tolerance": "fp32"},
            "checks": [{"runtime": "field:lite", "name": "field.drift", "status": "warn", "summary": "grows",
                        "metrics": {"windows": [{"worst_ratio": 0.5}]}}]}  # fmt: skip
    facts = {"steps": 4096, "chunks": 2, "recorded_by": "lite", "dropped_steps": 0, "streamed": True,
             "windows": [{"start_ns": 0, "end_ns": 10**9 * k, "steps": 1024, "max_abs": 1e-6 * k,
                          "worst_ratio": 0.01 * k, "mismatched_rows": 0, "ood_share": 0.001 * k, "new_field": [1, 2]}
                         for k in range(1, 5)],
             "ood": {"available": True, "sigma": 4.0, "share_beyond_sigma": 0.004, "per_dimension": [
                 {"dimension": 0, "mean_abs_z": 0.5, "max_abs_z": 4.2, "share_beyond_sigma": 0.004}]},
             "returns": {"episodes": 3, "mean": 10.0, "std": 1.0}}  # fmt: skip
    html = page(Run(data, facts))
    assert 'id="audit"' in html and "error against the tolerance per time window" in html
    assert "4096 steps recorded by" in html and "0.40% of steps beyond 4 training std" in html
    bare = page(Run(data, {"steps": 10}))  # an audit.json with fewer fields than today's
    assert 'id="audit"' in bare and "<svg" not in bare.split('id="audit"')[1]


def test_a_page_that_cannot_be_drawn_leaves_the_verdict_and_says_why(tmp_path, monkeypatch):
    from inference.report import html, sections

    def broken(run):
        raise KeyError("windows")

    monkeypatch.setattr(sections, "evidence", broken)
    html.write_page(tmp_path / "report.html", {"verdict": "INCONSISTENT (1 failed check(s))", "checks": []})
    text = (tmp_path / "report.html").read_text()
    assert "INCONSISTENT (1 failed check(s))" in text and "could not be drawn (KeyError" in text


def test_a_mode_that_was_not_played_is_a_row_of_the_episodes_table():
    """An argmax policy has no stochastic mode: its ``episodes.stochastic`` skip (one dot) is drawn, not a crash."""
    data = {"schema": "msrl-consistency/verify-report", "exit_code": 0, "verdict": "CONSISTENT",
            "bundle": {"env_id": "CartPole-v1"}, "runtimes": {"onnxruntime": {"status": "ran"}},
            "options": {"tolerance": "fp32"},
            "checks": [{"runtime": "inputs", "name": "episodes.stochastic", "status": "skip",
                        "summary": "no stochastic mode: a argmax policy takes no noise"},
                       {"runtime": "onnxruntime", "name": "episodes.teacher_forced.deterministic", "status": "pass",
                        "summary": "all agree", "metrics": {"differing_actions": 0, "steps": 100}}]}  # fmt: skip
    html = page(Run(data))
    assert "could not be drawn" not in html
    episodes = html.split('id="episodes"')[1]
    assert "no stochastic mode" in episodes and "not played" in episodes and "0 of 100 actions differ" in episodes


def test_report_links_are_relative_file_paths_and_only_the_pages_own_script_may_run():
    """A run directory named like a URL (``javascript:...``) stays a file path in the diff page's link, and the CSP
    allows the page's one script by its hash, never inline script (a link or handler that got in cannot run)."""
    import base64
    import hashlib

    from inference.report.diff_page import relative_url
    from inference.report.html import CSP, SCRIPT, document

    assert relative_url("javascript:document.title='PWNED';1/report.html") == \
        "./javascript%3Adocument.title%3D%27PWNED%27%3B1/report.html"  # fmt: skip
    assert relative_url("../a b/report.html") == "../a%20b/report.html"
    script_src = next(part for part in CSP.split(";") if part.strip().startswith("script-src"))
    assert "unsafe-inline" not in script_src
    digest = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
    assert f"'sha256-{digest}'" in script_src and f"<script>{SCRIPT}</script>" in document("t", "")


def test_diff_takes_a_vanished_gate_and_an_unknown_status_for_regressions():
    """A gate that passed in OLD and no longer runs in NEW guards nothing (a regression, not a change); a status
    string this diff cannot read is never taken for a pass."""
    from inference.report.diff import diff_runs, regressed

    def run(checks: list[dict]) -> Run:
        return Run({"schema": "msrl-consistency/verify-report", "exit_code": 0, "verdict": "CONSISTENT",
                    "runtimes": {"lite": {"status": "ran"}}, "options": {"tolerance": "fp32"},
                    "checks": checks})  # fmt: skip

    gate = {"runtime": "lite", "name": "observations.policy", "status": "pass", "summary": "agree"}
    other = {"runtime": "lite", "name": "repeatability", "status": "pass", "summary": "same bits"}
    changes = diff_runs(run([gate, other]), run([other]))
    assert regressed(changes), changes
    assert any(c.what == "lite observations.policy" and c.effect == "regression" for c in changes)
    odd = diff_runs(run([gate, other]), run([{**gate, "status": "PASSED"}, other]))
    assert regressed(odd) and any("does not know" in c.new for c in odd), odd
    assert not regressed(diff_runs(run([gate, other]), run([gate, other])))
