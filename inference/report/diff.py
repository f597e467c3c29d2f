"""Two runs side by side: what changed from OLD to NEW, and whether NEW regressed.

Both runs are read as the page reads them (``reading.Run``). A regression is: a worse verdict; a check that went
from passing to failing (or undecided), or a new failing one; a runtime compared in OLD and not in NEW; more action
flips, differing teacher-forced actions or diverging free-running episodes; a layer that began to diverge (or
diverges earlier); an output's error (max or p99 absolute) grown beyond noise; an audit's worst window grown
beyond noise. Everything else that differs (bundle and checkpoint hashes, precision, versions, inputs, smaller
metric moves) is listed as a change.

Noise: the same command on the same box gives the same bits, so a metric moves "beyond noise" when it moves by more
than half its old value and by more than 1% of the tolerance the runtime was granted for that output.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from inference.report.reading import Run, num, short

NOISE_REL = 0.5  # a metric moves beyond noise when it changes by more than this share of its old value ...
NOISE_TOL = 0.01  # ... and by more than this share of the tolerance granted (its atol)
VERDICT_RANK = {"CONSISTENT": 0, "NOT VERIFIED": 1, "INCONSISTENT": 2}
BAD = ("fail", "error")


@dataclass
class Change:
    kind: str  # verdict | check | runtime | metric | flips | episodes | layer | audit | provenance | inputs
    what: str
    old: str
    new: str
    effect: str  # regression | improvement | change

    def line(self, width: int = 0) -> str:
        """``what: old → new``; ``width``: each side cut to that many characters (for the summary line)."""

        def cut(text: str) -> str:
            return text if not width or len(text) <= width else text[: width - 1] + "…"

        return f"{self.what}: {cut(self.old)} → {cut(self.new)}"

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def diff_runs(old: Run, new: Run) -> list[Change]:
    """Every difference between two runs that a reader should know of, regressions first."""
    changes = [*_verdict(old, new), *_runtimes(old, new), *_checks(old, new), *_outputs(old, new),
               *_policy(old, new), *_episodes(old, new), *_layers(old, new), *_audit(old, new),
               *_provenance(old, new)]  # fmt: skip
    order = {"regression": 0, "improvement": 1, "change": 2}
    return sorted(changes, key=lambda c: order[c.effect])


def regressed(changes: list[Change]) -> bool:
    return any(c.effect == "regression" for c in changes)


def summary(changes: list[Change]) -> str:
    """One line: the outcome, the first regressions (or changes), and what differs in where the runs came from."""
    bad = [c for c in changes if c.effect == "regression"]
    context = [c for c in changes if c.kind in ("provenance", "inputs") and not c.what.startswith("file ")]
    why = f"; the runs differ in {'; '.join(c.line(40) for c in context[:4])}" if context else ""
    if bad:
        head = "; ".join(c.line(60) for c in bad[:3]) + (f"; +{len(bad) - 3} more" if len(bad) > 3 else "")
        return f"REGRESSED ({len(bad)} regression(s) in {len(changes)} change(s)): {head}{why}"
    if changes:
        shown = [c for c in changes if c not in context]
        head = "; ".join(c.line(60) for c in shown[:3]) + (f"; +{len(shown) - 3} more" if len(shown) > 3 else "")
        return f"CHANGED, no regression: {head or 'no metric beyond noise'}{why}"
    return "EQUIVALENT: no difference beyond noise"


# ---- the parts ------------------------------------------------------------------------------------------------


def _verdict(old: Run, new: Run) -> Iterator[Change]:
    if old.verdict_line != new.verdict_line:
        a, b = VERDICT_RANK.get(old.verdict, 1), VERDICT_RANK.get(new.verdict, 1)
        effect = "regression" if b > a else ("improvement" if b < a else "change")
        yield Change("verdict", "verdict", old.verdict_line, new.verdict_line, effect)


def _runtimes(old: Run, new: Run) -> Iterator[Change]:
    for name in dict.fromkeys([*old.runtimes, *new.runtimes]):
        a, b = old.runtimes.get(name, {}), new.runtimes.get(name, {})
        sa, sb = str(a.get("status", "absent")), str(b.get("status", "absent"))
        if sa == sb:
            continue
        reason = f" ({b['reason']})" if b.get("reason") else ""
        if sa == "ran":
            yield Change("runtime", f"{name} no longer compared", sa, sb + reason, "regression")
        elif sb == "ran":
            yield Change("runtime", f"{name} now compared", sa, sb, "improvement")
        else:
            yield Change("runtime", name, sa, sb + reason, "change")


KNOWN = {"pass", "fail", "warn", "skip", "error"}


def _key(c: dict[str, Any]) -> tuple[str, str]:
    return str(c.get("runtime")), str(c.get("name"))


def _checks(old: Run, new: Run) -> Iterator[Change]:
    before = {_key(c): c for c in old.checks}
    after = {_key(c): c for c in new.checks}
    lost = {n for n in old.compared if n not in new.compared}  # said once, as the runtime no longer compared
    for key, c in after.items():
        was = before.get(key)
        sa, sb = (str(was.get("status")) if was else "absent"), str(c.get("status"))
        if sa == sb:
            continue
        stage = (c.get("diagnosis") or {}).get("stage")
        detail = f"{sb}{f' ({stage})' if stage else ''}: {c.get('summary', '')}" if sb in BAD else sb
        if sb not in KNOWN:  # a status this diff cannot read is not taken for a pass
            effect, detail = "regression", f"{sb!r}, a status this diff does not know"
        elif sb in BAD and sa not in BAD:
            effect = "regression"
        elif sa in BAD and sb not in BAD:
            effect = "improvement"
        else:
            effect = "change"
        yield Change("check", " ".join(key), sa, detail, effect)
    for key, c in before.items():
        if key not in after and key[0] not in lost:  # a gate that passed and no longer runs guards nothing
            gate = str(c.get("status")) in ("pass", "warn")
            yield Change("check", " ".join(key), str(c.get("status")), "not run", "regression" if gate else "change")


def beyond_noise(a: float, b: float, tol: float | None) -> bool:
    """``b`` differs from ``a`` by more than the noise of the metric (see the module's docstring)."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return a != b and not (math.isnan(a) and math.isnan(b))
    return abs(b - a) > max(NOISE_REL * abs(a), NOISE_TOL * (tol or 0.0))


def _outputs(old: Run, new: Run) -> Iterator[Change]:
    before = {(str(c.get("runtime")), g, o): s for c, g, o, s in old.output_rows()}
    for c, graph, output, s in new.output_rows():
        was = before.get((str(c.get("runtime")), graph, output))
        if was is None or s.get("exact") or was.get("exact"):
            continue
        where = f"{c.get('runtime')} {graph}.{output}"
        for metric in ("max_abs", "p99_abs"):
            a, b = _float(was.get(metric)), _float(s.get(metric))
            if a is None or b is None or not beyond_noise(a, b, _float(was.get("atol"))):
                continue
            times = f" (×{b / a:.3g})" if a > 0 and b > 0 else ""
            yield Change("metric", f"{where} {metric.replace('_', ' ')}", num(a), num(b) + times,
                         "regression" if b > a else "improvement")  # fmt: skip
        a, b = int(was.get("mismatches") or 0), int(s.get("mismatches") or 0)
        if a != b:
            yield Change("metric", f"{where} elements beyond tolerance", str(a), str(b),
                         "regression" if b > a else "improvement")  # fmt: skip
        same_preset = _preset(old) == _preset(new)
        if same_preset and str(was.get("tolerance")) != str(s.get("tolerance")):  # else the preset's change says it
            yield Change("metric", f"{where} tolerance", str(was.get("tolerance")), str(s.get("tolerance")), "change")


def _preset(run: Run) -> Any:
    return (run.data.get("options") or {}).get("tolerance")


def _policy(old: Run, new: Run) -> Iterator[Change]:
    before = {_key(c): c.get("metrics") or {} for c in old.checks if str(c.get("name")).startswith("observations.")}
    for c in new.checks:
        m, was = c.get("metrics") or {}, before.get(_key(c))
        if was is None:
            continue
        where = " ".join(_key(c))
        a, b = _flips(was), _flips(m)
        if a is not None and b is not None and a != b:
            yield Change("flips", f"{where} action flips", str(a), str(b), "regression" if b > a else "improvement")
        for metric, label in (("kl", "KL max"), ("abs_delta_log_prob", "|Δ log p| max")):
            x, y = _float((was.get(metric) or {}).get("max")), _float((m.get(metric) or {}).get("max"))
            if x is not None and y is not None and beyond_noise(x, y, None) and max(x, y) > 1e-9:
                yield Change("metric", f"{where} {label}", num(x), num(y), "change")


def _flips(m: dict[str, Any]) -> int | None:
    for source in (m.get("flips"), m.get("argmax")):
        if isinstance(source, dict) and "flips" in source:
            return int(source["flips"])
    return None


def _episodes(old: Run, new: Run) -> Iterator[Change]:
    before = {_key(c): c.get("metrics") or {} for c in old.checks if str(c.get("name")).startswith("episodes.")}
    for c in new.checks:
        m, was = c.get("metrics") or {}, before.get(_key(c))
        if was is None:
            continue
        where = " ".join(_key(c))
        for metric, label in (("differing_actions", "differing actions"), ("episodes_diverged", "episodes diverged")):
            if metric in m and metric in was and int(m[metric]) != int(was[metric]):
                a, b = int(was[metric]), int(m[metric])
                yield Change("episodes", f"{where} {label}", str(a), str(b), "regression" if b > a else "improvement")
        a, b = _float(was.get("mean_return_delta")), _float(m.get("mean_return_delta"))
        if a is not None and b is not None and a != b:
            yield Change("episodes", f"{where} mean return Δ", num(a), num(b), "change")


def _layers(old: Run, new: Run) -> Iterator[Change]:
    for name, loc in new.localization.items():
        first = loc.get("first_diverging_layer")
        was = old.localization.get(name) or {}
        before = was.get("first_diverging_layer")
        if first == before:
            continue
        if first and not before:  # a regression where OLD compared the layers too; else OLD was not localised
            compared = any(r.get("status") in ("pass", "fail") for r in was.get("layers") or [])
            yield Change(
                "layer",
                f"{name} began to diverge" if compared else f"{name} localised",
                "no diverging layer" if compared else "not localised",
                f"{first} ({loc.get('first_diverging_kind')})",
                "regression" if compared else "change",
            )
        elif before and not first:
            yield Change("layer", f"{name} diverging layer", str(before), loc.get("message") or "none", "improvement")
        else:
            order = [str(r.get("scope")) for r in loc.get("layers") or []]
            earlier = before in order and order.index(str(first)) < order.index(str(before))
            yield Change("layer", f"{name} first diverging layer", str(before), str(first),
                         "regression" if earlier else "change")  # fmt: skip


def _audit(old: Run, new: Run) -> Iterator[Change]:
    if not (old.audit and new.audit):
        return
    a = max((_float(w.get("worst_ratio")) or 0.0 for w in old.audit.get("windows") or []), default=0.0)
    b = max((_float(w.get("worst_ratio")) or 0.0 for w in new.audit.get("windows") or []), default=0.0)
    if beyond_noise(a, b, 1.0):
        effect = "regression" if b > a else "improvement"
        yield Change("audit", "worst window (error / tolerance)", num(a), num(b), effect)
    x = _float((old.audit.get("ood") or {}).get("share_beyond_sigma"))
    y = _float((new.audit.get("ood") or {}).get("share_beyond_sigma"))
    if x is not None and y is not None and abs(y - x) > 0.001:
        yield Change("audit", "share of steps beyond training's range", f"{100 * x:.2f}%", f"{100 * y:.2f}%", "change")


def _provenance(old: Run, new: Run) -> Iterator[Change]:
    for label, a, b in _context(old, new):
        if a != b:
            yield Change("inputs" if label in ("env", "observations", "episodes", "seed") else "provenance", label,
                         a, b, "change")  # fmt: skip


def _context(old: Run, new: Run) -> Iterator[tuple[str, str, str]]:
    """(what, OLD's, NEW's) for the facts that say where a run came from."""

    def pick(run: Run) -> dict[str, str]:
        d, p = run.data, run.provenance
        bundle, opts, inputs = d.get("bundle") or {}, d.get("options") or {}, d.get("inputs") or {}
        ckpt = p.get("checkpoint") or {}
        check = next((c for c in run.checks if _key(c) == ("bundle", "provenance")), {})
        facts = {
            "bundle precision": str(bundle.get("precision")),
            "bundle manifest": short(bundle.get("manifest_sha256"), 16),
            "checkpoint": short(ckpt.get("sha256") or (check.get("metrics") or {}).get("checkpoint_sha256"), 16),
            "bundle exported from checkpoint": short(ckpt.get("exported_from_sha256"), 16),
            "tolerance preset": str(opts.get("tolerance")),
            "tolerance overrides": str(opts.get("overrides") or {}),
            "env": str(inputs.get("env") or inputs.get("recorded_observations")),
            "observations": str(opts.get("observations")),
            "episodes": str(opts.get("episodes")),
            "seed": str(opts.get("seed")),
        }
        exporter = (p.get("versions") or {}).get("exporter") or {}
        for key in ("mindspore", "onnx", "lite_sdk", "mind_ir_version"):
            if key in exporter:
                facts[f"exporter {key}"] = str(exporter[key])
        for name, info in run.runtimes.items():
            for key, value in (info.get("versions") or {}).items():
                facts[f"{name} {key}"] = str(value)
        for key in ("python", "numpy", "cann"):
            if key in (p.get("host") or {}):
                facts[f"host {key}"] = str(p["host"][key])
        for key, value in (p.get("bundle_files") or {}).items():
            facts[f"file {key}"] = short(value, 16)
        return facts

    a, b = pick(old), pick(new)
    # A report written before provenance was recorded knows none of it: compare only what both say.
    both = bool(old.provenance and new.provenance)
    keys = [*a, *b] if both else [k for k in a if k in b and "–" not in (a[k], b[k])]
    for key in dict.fromkeys(keys):
        yield key, a.get(key, "–"), b.get(key, "–")


def _float(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)
