"""Precision plans: the search finds the cheapest kept set (any set, not a prefix or suffix), the mismatch numbers
in policy terms, the batch-invariance matrix, and an int8 plan end to end (Lite's full quantization calibrated on
visited states, its ``.ms`` given back a dynamic batch, verify exit 0 as the search judged it)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import lite_build
import numpy as np
import pytest
from cli_inprocess import run_module

from inference.compare.judge.policy_level import flip_rate_ucb, mismatch
from msrl_consistency.precision.evaluate import Evaluation
from msrl_consistency.precision.layers import Layer
from msrl_consistency.precision.search import search

REPO = Path(__file__).resolve().parents[1]


def _fake(kept_needed: set[str]):
    """Within the bounds exactly when every layer of ``kept_needed`` stays in fp32."""

    def evaluate(kept: frozenset[str]) -> Evaluation:
        ok = kept_needed <= kept
        return Evaluation(kept, {}, {}, [] if ok else ["beyond"], 0.5 if ok else 2.0)

    return evaluate


def test_the_search_keeps_the_cheapest_set_even_when_it_is_not_a_prefix_or_suffix():
    layers = [Layer(s, "Dense", cost=c) for s, c in zip("ABCDE", (10, 100, 5, 100, 10), strict=True)]
    result = search(layers, _fake({"B", "D"}))
    assert result.kept == {"B", "D"} and result.final.ok and not result.all_lowered.ok
    assert "cheapest" in result.method
    # C (cost 5) keeps the bounds with B alone: the cheapest set is {B, C}, not {B, D} or every layer after B
    cheap = search(layers, lambda kept: Evaluation(kept, {}, {}, [] if {"B"} <= kept and kept & {"C", "D"} else
                                                   ["beyond"], 0.0))  # fmt: skip
    assert cheap.kept == {"B", "C"}


def test_the_search_lowers_everything_when_the_bounds_allow_it():
    layers = [Layer(s, "Dense", cost=1) for s in "ABC"]
    result = search(layers, lambda kept: Evaluation(kept, {}, {}, [], 0.1))
    assert result.kept == frozenset() and result.evaluations == 4  # three alone, then every layer lowered


def test_mismatch_numbers():
    same = mismatch(np.zeros(1000))
    assert same["mean_exp_abs"] == 1.0 and same["ess"] == 1.0 and same["k3_kl"] == 0.0 and same["is_mean"] == 1.0
    r = np.array([0.1, -0.1, 0.2, 0.0])
    got = mismatch(r)
    w = np.exp(r)
    assert got["ess"] == pytest.approx(w.sum() ** 2 / (4 * (w**2).sum()))
    assert got["k3_kl"] == pytest.approx(np.mean(w - 1 - r))
    assert got["mean_exp_abs"] == pytest.approx(np.exp(abs(r)).mean())
    assert flip_rate_ucb(0, 10_000) == pytest.approx(3.84e-4, rel=0.01)  # no flip in 10k still allows ~4e-4
    assert flip_rate_ucb(10, 1000) > 0.01 > flip_rate_ucb(0, 1000)


def test_the_batch_invariance_matrix_sees_a_row_that_depends_on_its_batch():
    from types import SimpleNamespace

    from inference.compare.judge.batch_invariance import batch_invariance

    class Contract:
        action = SimpleNamespace(is_discrete=True)

        def env_action(self, out):
            return np.asarray(out["y"]).argmax(-1)

    class Batchy:
        def infer(self, x):
            return {"y": (x * (1 + 1e-6 * (len(x) > 1))).astype(np.float32)}

    obs = np.random.default_rng(0).standard_normal((400, 3)).astype(np.float32)
    feeds = SimpleNamespace(finite=np.ones(400, bool), ordinary=np.ones(400, bool), graph_inputs=lambda b, g: [obs])
    bundle = SimpleNamespace(mode_graph=lambda mode: "policy", graphs=["policy"], contract=lambda g: Contract())
    matrix = batch_invariance(bundle, {"policy": Batchy()}, feeds)
    assert matrix["64"]["bitwise_equal_share"] < 1.0 and matrix["64"]["max_ulp"] > 0
    steady = batch_invariance(bundle, {"policy": SimpleNamespace(infer=lambda x: {"y": x * 2})}, feeds)
    assert all(steady[s]["bitwise_equal_share"] == 1.0 and steady[s]["max_ulp"] == 0 for s in ("8", "64", "256"))


def cli(module: str, *args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return run_module(module, *args, cwd=cwd, timeout=1800)


@pytest.mark.slow
@pytest.mark.skipif(not lite_build.BUILT and not lite_build.required(), reason=lite_build.WHY_NOT)
def test_an_int8_plan_end_to_end_and_the_search_and_verify_are_one_judge(cartpole_bundle, cartpole_ckpt, tmp_path):
    judge = ["--observations", "600", "--episodes", "2", "--seed", "3"]
    out = tmp_path / "int8"
    proc = cli("msrl_consistency.precision", "--bundle", str(cartpole_bundle.root), "--ckpt", str(cartpole_ckpt),
               "--lower", "int8", "--out", str(out), *judge)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    command = next(line for line in proc.stdout.splitlines() if line.startswith("verify it"))
    assert f"--ckpt {cartpole_ckpt}" in command and "CKPT" not in command, command  # runnable as printed
    manifest = json.loads((out / "manifest.json").read_text())
    plan = manifest["plan"]
    assert plan["lower"] == "int8" and plan["quantization"] == "full" and plan["final"]["ok"]
    assert plan["judge"] == {**plan["judge"], "runtime": "lite", "preset": "int8", "observations": 600, "episodes": 2,
                             "seed": 3}  # fmt: skip
    assert plan["source_graphs"] == {g: cartpole_bundle.graph(g)["files"]["onnx"]["sha256"]
                                     for g in cartpole_bundle.graphs}  # fmt: skip
    assert "visits in seeded episodes" in plan["calibration"]["source"] and plan["calibration"]["count"] > 50
    assert {layer["scope"] for layer in plan["layers"]} >= {"actor.layers.0", "post-processing"}
    assert all("sensitivity" in layer and "badness" in layer["sensitivity"] for layer in plan["layers"])
    badness = [layer["sensitivity"]["badness"] for layer in plan["layers"] if "Dense" in layer["kind"]]
    assert len(set(badness)) > 1, badness  # the sensitivity ranks the layers: no score every layer shares
    assert manifest["target"]["computes_in"] == "int8"
    config = (out / "lite_converter.policy.cfg").read_text()
    assert "quant_type=FULL_QUANT" in config and "calibrate_path=obs:" in config
    kept_nodes = [n for layer in plan["layers"] if layer["precision"] == "fp32" for n in layer["nodes"]["policy"]]
    assert all(n in config for n in kept_nodes)
    assert any(layer["precision"] == "int8" and layer["kind"] == "Dense" for layer in plan["layers"])
    assert (out / "policy_sample.ms").read_bytes() != (cartpole_bundle.root / "policy_sample.ms").read_bytes()
    assert "# Precision plan: int8" in (out / "plan.md").read_text()

    from inference.compare.feeds import seeded_feeds
    from inference.lite.client import LiteRunner

    obs = seeded_feeds(cartpole_bundle, 300, 0).obs
    obs = obs[np.isfinite(obs).all(1)][:256]
    with LiteRunner(out / "policy.ms") as runner:  # calibrated at batch 1: Lite resizes it to any batch
        whole = runner.infer(obs)["logits"]
        alone = np.concatenate([runner.infer(obs[k : k + 1])["logits"] for k in range(len(obs))])
    assert whole.shape == (len(obs), 2) and np.array_equal(whole, alone)

    # One judge: the plan the search accepted is a bundle verify passes with the same observations, episodes and seed
    proc = cli("msrl_consistency.verify", "--bundle", str(out), "--ckpt", str(cartpole_ckpt), *judge, "--out",
               str(tmp_path / "report"))  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    lite = report["runtimes"]["lite"]
    assert lite["status"] == "ran" and lite["precision"]["computes_in"] == "int8"
    assert lite["precision"]["judged_as"] == "int8" and lite["precision"]["bounds"]["flip_rate_ucb"] == 0.01
    gate = next(c for c in report["checks"] if c["runtime"] == "lite" and c["name"] == "policy.policy")
    assert gate["status"] in ("pass", "warn") and gate["metrics"]["bounds"]["preset"] == "int8"  # warn: few rows

    # ... and every layer lowered: the search's verdict on that bundle is verify's, whichever it is
    every = tmp_path / "every"
    proc = cli("msrl_consistency.precision", "--bundle", str(cartpole_bundle.root), "--ckpt", str(cartpole_ckpt),
               "--lower", "int8", "--out", str(every), "--keep", "none", *judge)  # fmt: skip
    accepted = json.loads((every / "manifest.json").read_text())["plan"]["final"]["ok"]
    assert proc.returncode == (0 if accepted else 1), proc.stderr[-2000:]
    verdict = cli("msrl_consistency.verify", "--bundle", str(every), "--ckpt", str(cartpole_ckpt), *judge,
                  "--runtimes", "lite", "--out", str(tmp_path / "every-report"))  # fmt: skip
    assert verdict.returncode == (0 if accepted else 1), verdict.stdout[-3000:]

    # The adversary: the int8 plan pasted onto the float32 bundle (its .ms untouched), its bounds at 1e300
    forged = tmp_path / "forged"
    shutil.copytree(cartpole_bundle.root, forged)
    data = json.loads((forged / "manifest.json").read_text())
    data["plan"] = {**plan, "bounds": {k: 1e300 for k in plan["bounds"]}}
    (forged / "manifest.json").write_text(json.dumps(data))
    proc = cli("msrl_consistency.verify", "--bundle", str(forged), "--ckpt", str(cartpole_ckpt), *judge)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "claims int8 for layer" in proc.stderr and "float32" in proc.stderr, proc.stderr[-1000:]
