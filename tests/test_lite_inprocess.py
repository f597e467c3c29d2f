"""Lite in the calling process (``libmsrl-lite.so`` through ctypes): the same bits as the runner process with the graph
on the calling thread and as Lite's own hand-off, whether a model runs inline known per model, Lite's float mode for
the graph and the caller's own for everything else, threads sharing a model, bad feeds refused before Lite sees them,
and ``inference.load`` for a team's control loop. Lite and MindSpore
cannot share a process, so everything in-process runs in a child Python with MindSpore made unimportable."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import lite_build
import pytest

from inference.lite.client import LiteRunner
from inference.lite.inprocess import in_process_reason, library_path, open_lite

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
import inference.lite.inprocess as lite_inprocess
from inference.lite.client import LiteRunner
from inference.lite.inprocess import LiteModel
result, staged = {}, lite_inprocess._STAGE_BYTES
for path in PATHS:
    for stage in (staged, 0) if path in PASSED else (staged,):  # feeds copied into the call's buffers / passed as is
        lite_inprocess._STAGE_BYTES = stage
        model, runner, handoff = LiteModel(path), LiteRunner(path), LiteModel(path, inline=False)
        rng = np.random.default_rng(0)
        same = []
        for batch in (1, 7, 64, 1, 7):  # shapes again after others: buffers kept per shape, Lite resized back
            feeds = [rng.standard_normal((batch, *m.shape[1:])).astype(m.dtype) * 3 for m in model.inputs]
            if batch == 7:
                feeds = [np.asfortranarray(f) for f in feeds]  # not C-contiguous
            a, b, c = model.infer(*feeds), runner.infer(*feeds), handoff.infer(*feeds)
            same.append(sorted(a) == sorted(b) == sorted(c)
                        and all(a[k].tobytes() == b[k].tobytes() == c[k].tobytes() for k in b))
        # on the calling thread, the runner's serving thread, and (not) for the model handed off to Lite's thread
        result[f"{path} {stage}"] = same + [model.runs_inline, runner.runs_inline, not handoff.runs_inline]
        model.close(); runner.close(); handoff.close()
print(json.dumps(result))
"""


def test_in_process_lite_gives_the_runners_bits(cartpole_bundle, pendulum_bundle, tmp_path):
    from foreign_policies import FRAME_CONTRACT, make_frame_cnn

    from msrl_consistency.api import export_policy

    cnn = export_policy(make_frame_cnn(), FRAME_CONTRACT, tmp_path / "cnn")
    paths = [str(b.file(g, "ms")) for b in (cartpole_bundle, pendulum_bundle) for g in b.graphs]
    paths.append(str(cnn.file("policy", "ms")))
    passed = [paths[0], paths[-1]]  # a trainer's graph and the CNN also with their feeds passed as they are
    result = deploy_python(f"PATHS = {paths!r}\nPASSED = {passed!r}\n" + AGREE)
    assert {k.rsplit(" ", 1)[0] for k in result} == set(paths) and len(result) == len(paths) + len(passed)
    # the bits equal at every batch, then where each ran: inline (in-process, runner) and handed off
    assert {k: v for k, v in result.items() if v != [True] * 8} == {}


def test_a_graph_lite_corrupts_when_resized_after_a_predict_runs_every_batch(tmp_path):
    """A LayerNorm over ``[1, batch, n]`` (QMIX's agent): Lite 2.0.0 resizing it after a Predict corrupted its heap;
    the runner and the in-process library build the model again for a new batch, and agree bit for bit."""
    import layer_policies as lp

    from msrl_consistency.api import export_policy

    bundle = export_policy(lp.make_expanded_layernorm(), lp.CARTPOLE_LOGITS, tmp_path / "bundle")
    path = str(bundle.file("policy", "ms"))
    batches = AGREE.replace("(1, 7, 64, 1, 7)", "(1, 256, 3, 64, 1)")
    result = deploy_python(f"PATHS = [{path!r}]\nPASSED = []\n" + batches)
    assert list(result.values()) == [[True] * 8], result


def test_lite_computes_in_its_float_mode_and_leaves_the_callers_alone(tmp_path):
    """Lite's x86 threads flush denormals to zero, and Lite's Build switches its caller's thread to that mode too.
    In-process, the graph must compute in that mode (or its answer would differ from the runner's), and the
    caller's own arithmetic (an env's physics, say) must keep its mode. A 1e30 gain on denormals tells them apart."""
    import mindspore as ms
    import numpy as np
    from mindspore import nn

    from msrl_consistency.api import export_policy

    gain = nn.Dense(4, 2, weight_init=ms.Tensor(np.full((2, 4), 1e30, np.float32)), bias_init="zeros")
    contract = {"input": {"obs": [4]}, "outputs": {"names": ["logits"]},
                "action": {"kind": "categorical", "logits": "logits"}}  # fmt: skip
    path = str(export_policy(gain, contract, tmp_path / "gain").file("policy", "ms"))
    result = deploy_python(f"""
        import os
        import numpy as np
        from inference.lite.client import LiteRunner
        from inference.lite.inprocess import LiteModel
        obs = np.full((3, 4), 1e-39, np.float32)  # denormal
        caller = lambda: float(obs[0, 0] * np.float32(1e30))  # this thread's own arithmetic
        before = caller()
        model = LiteModel({path!r})
        opened = caller()
        here = model.infer(obs)["logits"]
        handed_off = LiteModel({path!r}, inline=False).infer(obs)["logits"]  # on the actor thread Build started
        after = caller()
        with LiteRunner({path!r}) as runner:  # the runner runs the graph on its serving thread too
            runner_inline = runner.infer(obs)["logits"]
            where = [runner.runs_inline]
        os.environ["MSRL_LITE_INLINE"] = "0"
        with LiteRunner({path!r}) as runner:  # on Lite's own actor thread
            worker = runner.infer(obs)["logits"]
            where.append(runner.runs_inline)
        same = here.tobytes() == handed_off.tobytes() == runner_inline.tobytes() == worker.tobytes()
        print(json.dumps({{"caller": [before, opened, after], "here": here.tolist(), "inline": model.runs_inline,
                          "runner_inline": where, "same": same}}))
    """)
    assert result["caller"] == [pytest.approx(1e-9, rel=1e-3)] * 3  # never flushed, before or after Lite
    assert result["here"] == [[0.0, 0.0]] * 3 and result["inline"] and result["same"]
    assert result["runner_inline"] == [True, False]


def test_whether_a_model_runs_inline_is_its_own(cartpole_bundle):
    """One model of a process ran inline; another, opened with inline runs off (MSRL_LITE_INLINE=0 as a user sets it,
    or inline=False), did not: each says so of itself, and a model says nothing before its first call."""
    result = deploy_python(f"""
        import os
        import numpy as np
        from inference.lite.inprocess import LiteModel
        path = {str(cartpole_bundle.file("policy", "ms"))!r}
        obs = np.zeros((2, 4), np.float32)
        first = LiteModel(path)
        before = first.runs_inline
        first.infer(obs)
        os.environ["MSRL_LITE_INLINE"] = "0"
        off = LiteModel(path)
        del os.environ["MSRL_LITE_INLINE"]
        asked_off, default = LiteModel(path, inline=False), LiteModel(path)
        for model in (off, asked_off, default):
            model.infer(obs); model.infer(obs)
        stats = off.inline_stats()
        first.close()
        print(json.dumps({{"before": before, "first": first.runs_inline, "off": off.runs_inline,
                          "asked_off": asked_off.runs_inline, "default": default.runs_inline, "off_stats": stats}}))
    """)
    assert result.pop("off_stats") == {"calls": 2, "inline_calls": 0, "requested": False}
    assert result == {"before": False, "first": True, "off": False, "asked_off": False, "default": True}


def test_threads_sharing_a_model_each_get_their_own_answers(cartpole_bundle):
    """A model shared by threads (a server answering several envs) takes one call at a time, in this process and
    through the runner's pipe: no thread's feeds or outputs are overwritten by another's."""
    result = deploy_python(f"""
        import threading
        import numpy as np
        from inference.lite.client import LiteRunner
        from inference.lite.inprocess import LiteModel
        path = {str(cartpole_bundle.file("policy", "ms"))!r}
        obs = [np.random.default_rng(k).standard_normal((3, 4)).astype(np.float32) for k in range(4)]
        wrong = {{}}
        for name, model, calls in (("in-process", LiteModel(path), 1500), ("runner", LiteRunner(path), 200)):
            want = [model.infer(o)["logits"].copy() for o in obs]
            wrong[name] = []
            def loop(k):
                for _ in range(calls):
                    try:
                        same = model.infer(obs[k])["logits"].tobytes() == want[k].tobytes()
                    except Exception as exc:  # a desynchronised pipe, say
                        same = repr(exc)
                    if same is not True:
                        wrong[name].append(same or k)
            threads = [threading.Thread(target=loop, args=(k,)) for k in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            model.close()
        print(json.dumps(wrong))
    """)
    assert result == {"in-process": [], "runner": []}


def test_bad_feeds_are_refused_before_lite_sees_them(cartpole_bundle):
    result = deploy_python(f"""
        import numpy as np
        from inference.lite.inprocess import LiteModel
        from inference.bundle.tensors import FeedError
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
        strided = np.asfortranarray(np.repeat(obs, 2, 0))  # not C-contiguous: the same answer
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
        from inference.lite.inprocess import LiteModel
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
        from inference.lite.client import LiteRunner
        out = {{}}
        for name, root in (("cartpole", {str(cartpole_bundle.root)!r}), ("pendulum", {str(pendulum_bundle.root)!r})):
            policy = inference.load(root)
            runner = LiteRunner(policy.bundle.file(policy.graph, "ms"))
            obs = np.random.default_rng(1).standard_normal((64, policy.contract.obs_shape[0])).astype(np.float32)
            want = policy.contract.env_action(runner.infer(obs))
            batch = policy.act(obs)
            first = batch.copy()
            again = policy.act(obs * 2)
            view = policy.act_view(obs)
            singles = np.stack([policy.act(row).copy() for row in obs])
            sto = [inference.load(root, mode="stochastic", seed=3).act(obs).copy() for _ in range(2)]
            out[name] = {{"runtime": policy.runtime, "batch": bool(np.array_equal(first, want)),
                          "kept": bool(np.array_equal(batch, first)) and again is not batch,
                          "same_buffer": policy.act_view(obs * 3) is view,
                          "singles": bool(np.array_equal(singles, want)),
                          "seeded": bool(np.array_equal(*sto)), "differs": bool(not np.array_equal(sto[0], want))}}
            policy.close(); runner.close()
        print(json.dumps(out))
    """)
    for name in ("cartpole", "pendulum"):
        r = result[name]
        assert r["runtime"] == "lite" and r["batch"] and r["singles"] and r["seeded"] and r["differs"], (name, r)
        assert r["kept"], (name, r)  # what act returns is the caller's: a later call does not overwrite it
    assert result["cartpole"]["same_buffer"]  # act_view: the graph's action output, handed back without a copy


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
            outputs = p.act_outputs(obs[-1])[1]
            scores.append(np.concatenate([np.ravel(v) for k, v in sorted(outputs.items())]))
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


def test_the_latency_benchmark_times_the_hand_off_in_its_own_process(cartpole_bundle, tmp_path):
    """bench/inference_latency.py's hand-off row comes from a process started with MSRL_LITE_INLINE=0, as a real one
    runs: its graph on Lite's actor thread, that thread pinned to one CPU (the caller's); the other rows from a process
    where the graph ran on the calling thread."""
    import importlib.util

    import numpy as np

    spec = importlib.util.spec_from_file_location("inference_latency", REPO / "bench" / "inference_latency.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    obs = np.random.default_rng(0).standard_normal((300, 4)).astype(np.float32)
    deploy = bench.deploy_side(cartpole_bundle, obs, 50, tmp_path)
    default, handoff = deploy["default"], deploy[bench.HANDOFF]
    assert default["pid"] != handoff["pid"] and default["MSRL_LITE_INLINE"] is None
    assert (default["runs_inline"], handoff["MSRL_LITE_INLINE"], handoff["runs_inline"]) == (True, "0", False)
    assert handoff["actor_cpus"] and all(len(cpus) == 1 for cpus in handoff["actor_cpus"])
    assert set(handoff["rows"]) == {"onnxruntime session", "lite in this process, infer_into"}
    table = bench.deploy_table(deploy)
    assert any(line.startswith(f"| {bench.HANDOFF} | lite in this process, infer_into |") for line in table)
