"""Lite in the calling process (``libmsrl-lite.so`` through ctypes): the same bits as the runner process, bad feeds
refused before Lite sees them, and ``inference.load`` for a team's control loop. Lite and MindSpore cannot share a
process, so everything in-process runs in a child Python with MindSpore made unimportable."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import lite_build
import pytest

from inference.lite_client import LiteRunner
from inference.lite_inprocess import in_process_reason, library_path, open_lite

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not lite_build.BUILT and not lite_build.required(), reason=lite_build.WHY_NOT)


def deploy_python(code: str) -> dict:
    """Run ``code`` in a fresh Python without MindSpore (the deploy side); it prints one JSON line."""
    script = "import sys, json\nsys.modules['mindspore'] = None\n" + textwrap.dedent(code)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


AGREE = """
import numpy as np
from inference.lite_client import LiteRunner
from inference.lite_inprocess import LiteModel
result = {}
for path in PATHS:
    model, runner = LiteModel(path), LiteRunner(path)
    rng = np.random.default_rng(0)
    same = []
    for batch in (1, 7, 64, 1, 7):  # shapes again after others: buffers kept per shape, Lite resized back
        feeds = [rng.standard_normal((batch, *(d for d in m.shape[1:]))).astype(m.dtype) * 3 for m in model.inputs]
        a, b = model.infer(*feeds), runner.infer(*feeds)
        same.append(sorted(a) == sorted(b) and all(a[k].tobytes() == b[k].tobytes() for k in b))
    result[path] = same
    model.close(); runner.close()
print(json.dumps(result))
"""


def test_in_process_lite_gives_the_runners_bits(cartpole_bundle, pendulum_bundle, tmp_path):
    from foreign_policies import FRAME_CONTRACT, make_frame_cnn

    from msrl_consistency.api import export_policy

    cnn = export_policy(make_frame_cnn(), FRAME_CONTRACT, tmp_path / "cnn")
    paths = [str(b.file(g, "ms")) for b in (cartpole_bundle, pendulum_bundle) for g in b.graphs]
    paths.append(str(cnn.file("policy", "ms")))
    result = deploy_python(f"PATHS = {paths!r}\n" + AGREE)
    assert result == {p: [True] * 5 for p in paths}


def test_bad_feeds_are_refused_before_lite_sees_them(cartpole_bundle):
    result = deploy_python(f"""
        import numpy as np
        from inference.lite_inprocess import LiteModel
        from inference.tensors import FeedError
        model = LiteModel({str(cartpole_bundle.file("policy", "ms"))!r}, max_rows=100)
        obs = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
        errors = {{}}
        cases = {{"dtype": (obs.astype(np.float64),), "rank": (obs[0],), "width": (obs[:, :3].copy(),),
                  "count": (obs, obs), "rows": (np.zeros((101, 4), np.float32),), "list": ([1, 2, 3, 4],)}}
        for name, feeds in cases.items():
            try:
                model.infer(*feeds)
                errors[name] = None
            except FeedError as exc:
                errors[name] = str(exc)
        strided = np.asfortranarray(np.repeat(obs, 2, 0))  # not C-contiguous: copied, then the same answer
        plain = np.ascontiguousarray(strided)
        same = model.infer(strided)["logits"].tobytes() == model.infer(plain)["logits"].tobytes()
        model.close()
        try:
            model.infer(obs)
            closed = None
        except Exception as exc:
            closed = str(exc)
        print(json.dumps({{"errors": errors, "strided_same": same, "closed": closed}}))
    """)
    errors = result["errors"]
    assert "dtype float64 != expected float32" in errors["dtype"] and "rank 1" in errors["rank"]
    assert "dim 1 is 3, the model needs 4" in errors["width"] and "expected 1 inputs, got 2" in errors["count"]
    assert "101 rows exceed the cap of 100" in errors["rows"] and "NumPy array" in errors["list"]
    assert result["strided_same"] and "closed" in result["closed"]


def test_load_failures_are_the_runners_exceptions(cartpole_bundle, tmp_path):
    bad = tmp_path / "bad.ms"
    bad.write_bytes(b"not a model")
    result = deploy_python(f"""
        from inference.lite_inprocess import LiteModel
        out = {{}}
        for name, path in {{"missing": "/nonexistent/p.ms", "corrupt": {str(bad)!r},
                           "mindir": {str(cartpole_bundle.file("policy", "mindir"))!r}}}.items():
            try:
                LiteModel(path)
                out[name] = None
            except Exception as exc:
                out[name] = [type(exc).__name__, str(exc), getattr(exc, "max_mind_ir_version", None)]
        print(json.dumps(out))
    """)
    assert result["missing"][0] == "ModelLoadError" and "not found" in result["missing"][1]
    assert result["corrupt"][0] == "ModelLoadError"
    if lite_build.MAX_MINDIR is not None and lite_build.MAX_MINDIR < 3:  # this Lite cannot read MindSpore 2.10's MindIR
        assert result["mindir"][0] == "MindIRVersionError" and result["mindir"][2] == lite_build.MAX_MINDIR


def test_a_process_with_mindspore_gets_the_runner(cartpole_bundle):
    """Lite and MindSpore cannot share a process: here (MindSpore imported) Lite runs in the runner process."""
    assert "MindSpore is imported" in in_process_reason()
    with open_lite(cartpole_bundle.file("policy", "ms")) as lite:
        assert isinstance(lite, LiteRunner) and lite.pid != __import__("os").getpid()
    assert library_path().is_file()


def test_load_acts_like_the_runner_in_a_control_loop(cartpole_bundle, pendulum_bundle):
    result = deploy_python(f"""
        import numpy as np
        import inference
        from inference.lite_client import LiteRunner
        out = {{}}
        for name, root in (("cartpole", {str(cartpole_bundle.root)!r}), ("pendulum", {str(pendulum_bundle.root)!r})):
            policy = inference.load(root)
            runner = LiteRunner(policy.bundle.file(policy.graph, "ms"))
            obs = np.random.default_rng(1).standard_normal((64, policy.contract.obs_shape[0])).astype(np.float32)
            want = policy.contract.env_action(runner.infer(obs))
            batch = policy.act(obs)
            first = batch.copy()
            again = policy.act(obs)
            singles = np.stack([policy.act(row).copy() for row in obs])
            sto = [inference.load(root, mode="stochastic", seed=3).act(obs).copy() for _ in range(2)]
            out[name] = {{"runtime": policy.runtime, "batch": bool(np.array_equal(first, want)),
                          "same_buffer": again is batch, "singles": bool(np.array_equal(singles, want)),
                          "seeded": bool(np.array_equal(*sto)), "differs": bool(not np.array_equal(sto[0], want))}}
            policy.close(); runner.close()
        print(json.dumps(out))
    """)
    for name in ("cartpole", "pendulum"):
        r = result[name]
        assert r["runtime"] == "lite" and r["batch"] and r["singles"] and r["seeded"] and r["differs"], (name, r)
    assert result["cartpole"]["same_buffer"]  # the graph's action output: handed back without a copy


def test_load_carries_a_recurrent_state(tmp_path):
    from byo_examples import EXAMPLES, example_module

    from msrl_consistency.api import export_policy

    example = EXAMPLES / "recurrent"
    make = example_module(example, "inprocess_recurrent_policy").make_policy
    bundle = export_policy(make(), example / "contract.toml", tmp_path / "gru")
    result = deploy_python(f"""
        import numpy as np
        import inference
        policy = inference.load({str(bundle.root)!r})
        obs = np.random.default_rng(2).standard_normal((6, 3, *policy.contract.obs_shape)).astype(np.float32)
        first = [policy.act(o).copy() for o in obs]
        state = policy.state.copy()
        policy.reset()
        again = [policy.act(o).copy() for o in obs]
        scores = []
        for carried in (True, False):  # the last step's scores, with and without the steps before it
            p = inference.load({str(bundle.root)!r})
            for o in obs[:-1] if carried else []:
                p.act(o)
            p.act(obs[-1])
            scores.append(np.concatenate([np.ravel(v) for k, v in sorted(p.outputs.items())]).copy())
        name = policy.contract.states[0].name
        try:  # another batch size mid-episode: refused, never a silent restart of every episode's memory
            policy.act(obs[0, :2])
            refused = ""
        except inference.FeedError as exc:
            refused = str(exc)
        policy.reset()
        after_reset = policy.act(obs[0, :2]).shape
        print(json.dumps({{"replayed": all(np.array_equal(a, b) for a, b in zip(first, again)),
                          "state_moved": bool(np.abs(state[name]).sum() > 0),
                          "history_matters": bool(not np.array_equal(*scores)),
                          "refused": refused, "after_reset": list(after_reset)}}))
    """)
    assert result.pop("refused").startswith("the carried state holds 3 row(s) and this call has 2 observation(s)")
    assert result == {"replayed": True, "state_moved": True, "history_matters": True, "after_reset": [2]}
