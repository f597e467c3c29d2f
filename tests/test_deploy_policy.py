"""``inference.load``'s Policy as a team's control loop uses it: shared by threads, answers kept, what it accepts
(checked, never cast), the runtime ``best`` falls back to and why, deterministic acting of noise-input graphs, and
env ids that never import code."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import foreign_policies as fp
import numpy as np
import pytest

from inference.bundle import load_bundle
from inference.bundle.tensors import FeedError
from inference.errors import UsageError
from inference.lite.common import runner_available
from inference.policy import Policy

REPO = Path(__file__).resolve().parents[1]
needs_runner = pytest.mark.skipif(not runner_available()[0], reason=runner_available()[1])


def deploy(code: str, cwd: Path = REPO, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh Python without MindSpore (the deploy side, where Lite runs in the process)."""
    script = "import sys, json\nsys.modules['mindspore'] = None\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=cwd, timeout=600,
                          env=env)  # fmt: skip


def deploy_json(code: str, **kwargs) -> dict:
    proc = deploy(code, **kwargs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def sac_bundle(tmp_path_factory):
    from msrl_consistency.api import export_policy

    return export_policy(fp.make_sac(), fp.SAC_CONTRACT, tmp_path_factory.mktemp("sac") / "bundle")


@pytest.fixture(scope="module")
def dict_bundle(tmp_path_factory):
    from msrl_consistency.api import export_policy

    return export_policy(fp.make_dict_policy(), fp.DICT_CONTRACT, tmp_path_factory.mktemp("dict") / "bundle")


def edited_copy(bundle, tmp_path: Path, edit) -> Path:
    copy = tmp_path / "edited"
    shutil.copytree(bundle.root, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    edit(manifest)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


# -- shared and kept ---------------------------------------------------------------------------------------
THREADS = """
import threading
import numpy as np
import inference
THREADS, CALLS = 8, {calls}
out = {{}}
for runtime in {runtimes!r}:
    policy = inference.load({root!r}, runtime=runtime)
    rng = np.random.default_rng(0)
    obs = [rng.standard_normal((16, 3)).astype(np.float32) * (t + 1) for t in range(THREADS)]
    want = [np.stack([policy.act(row) for row in rows]) for rows in obs]  # one thread, one call at a time
    wrong = [0] * THREADS

    def loop(t):
        for i in range(CALLS):
            k = i % 16
            if not np.array_equal(policy.act(obs[t][k]), want[t][k]):
                wrong[t] += 1

    threads = [threading.Thread(target=loop, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    kept = [policy.act(rows[0]) for rows in obs]  # actions kept in a list stay what they were
    out[runtime] = {{"served": policy.runtime, "wrong": wrong,
                     "kept": all(np.array_equal(k, w[0]) for k, w in zip(kept, want))}}
    policy.close()
print(json.dumps(out))
"""


@needs_runner
@pytest.mark.slow
def test_eight_threads_share_one_policy_without_a_wrong_action(pendulum_bundle):
    """8 threads x 10,000 calls on one Policy: every answer is the one a single thread gets, on every runtime (Lite in
    this process reused its output buffer across threads before: 4-12 wrong actions per thread in 3,000 calls)."""
    runtimes = ["lite", "onnxruntime", "lite-isolated"]
    out = deploy_json(THREADS.format(calls=10_000, runtimes=runtimes, root=str(pendulum_bundle.root)))
    for runtime in runtimes:
        assert out[runtime]["served"] == runtime and out[runtime]["kept"], out[runtime]
        assert out[runtime]["wrong"] == [0] * 8, (runtime, out[runtime])


@needs_runner
def test_a_kept_action_is_not_overwritten_by_the_next_call(pendulum_bundle):
    out = deploy_json(f"""
        import numpy as np
        import inference
        policy = inference.load({str(pendulum_bundle.root)!r})
        rng = np.random.default_rng(0)
        obs = rng.standard_normal((5, 3)).astype(np.float32)
        kept = [policy.act(o) for o in obs]
        print(json.dumps({{"runtime": policy.runtime, "distinct": len({{float(k[0]) for k in kept}}),
                           "same": bool(np.array_equal(np.stack(kept), np.stack([policy.act(o) for o in obs])))}}))
    """)
    assert out == {"runtime": "lite", "distinct": 5, "same": True}


# -- what act accepts ----------------------------------------------------------------------------------------
def test_act_refuses_a_float_frame_for_a_uint8_input_and_names_the_fix(dict_bundle):
    policy = Policy(dict_bundle, runtime="onnxruntime")
    rng = np.random.default_rng(0)
    vec, img = rng.standard_normal(4).astype(np.float32), rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    with pytest.raises(FeedError) as bug:  # the host-side /255 a team's own loop added
        policy.act({"vec": vec, "img": img / 255.0})
    message = str(bug.value)
    assert "observation 'img'" in message and "float64" in message and "uint8" in message
    assert "divided by 255" in message and len(message.splitlines()) == 1
    with pytest.raises(FeedError, match=r"observation 'img': float32 \(values .*\) given, the policy takes uint8"):
        policy.act({"vec": vec, "img": img.astype(np.float32)})
    with pytest.raises(FeedError, match="observation 'vec': float64 .* given, the policy takes float32: convert"):
        policy.act({"vec": vec.astype(np.float64), "img": img})
    with pytest.raises(FeedError, match="observation lacks key\\(s\\) 'img'"):
        policy.act({"vec": vec})
    with pytest.raises(FeedError, match="observation has key\\(s\\) 'depth' the policy does not take"):
        policy.act({"vec": vec, "img": img, "depth": img})
    with pytest.raises(FeedError, match="key 'vec' holds one observation and key 'img' a batch"):
        policy.act({"vec": vec, "img": img[None]})
    with pytest.raises(FeedError, match="observation 'img' has shape \\[8, 8\\]"):
        policy.act({"vec": vec, "img": img[..., 0]})
    one = policy.act({"vec": vec, "img": img})
    assert np.ndim(one) == 0 and policy.act({"vec": vec.tolist(), "img": img}) == one  # Python numbers: values


def test_act_takes_a_vector_envs_dict_batch(dict_bundle):
    """Gymnasium's vector envs batch a Dict observation as a dict of arrays with the batch first."""
    policy = Policy(dict_bundle, runtime="onnxruntime")
    rng = np.random.default_rng(1)
    batch = {"vec": rng.standard_normal((3, 4)).astype(np.float32),
             "img": rng.integers(0, 256, (3, 8, 8, 3), dtype=np.uint8)}  # fmt: skip
    actions = policy.act(batch)
    singles = [policy.act({k: v[i] for k, v in batch.items()}) for i in range(3)]
    rows = [{k: v[i] for k, v in batch.items()} for i in range(3)]
    assert actions.shape == (3,) and actions.tolist() == singles == policy.act(rows).tolist()
    with pytest.raises(FeedError, match="the keys hold different numbers of rows"):
        policy.act({"vec": batch["vec"], "img": batch["img"][:2]})


@pytest.mark.parametrize("runtime", ["lite", "onnxruntime"])
def test_a_layout_accepted_once_is_fed_again_and_any_other_is_checked(cartpole_bundle, runtime):
    """The check's verdict is kept per dtype, shape and strides: the same layout again gets the same answer as a
    fresh policy, the answer stays the caller's, and every other layout is checked as the first one was."""
    policy, fresh = Policy(cartpole_bundle, runtime=runtime), Policy(cartpole_bundle, runtime=runtime)
    rng = np.random.default_rng(3)
    rows = (rng.standard_normal((6, 4)) * 0.3).astype(np.float32)
    kept = [policy.act(r) for r in rows]  # the first call checks, the others take the short path
    assert [int(k) for k in kept] == [int(fresh.act(r)) for r in rows]
    batch = policy.act(rows)
    assert batch.tolist() == [int(k) for k in kept] and batch.base is None  # a copy, not the runtime's buffer
    strided = np.asfortranarray(rows)  # the same shape and dtype, other strides: checked, then fed as it is
    assert policy.act(strided).tolist() == batch.tolist()
    assert policy.act(rows[::2]).tolist() == batch[::2].tolist()  # a strided view of three rows
    for wrong, message in ((rows[0].astype(np.float64), "float64"), (rows[0, :3], "shape \\[3\\]"),
                           (rows.astype(np.float16), "float16")):  # fmt: skip
        with pytest.raises(FeedError, match=message):
            policy.act(wrong)
    assert int(policy.act(rows[0])) == int(kept[0])  # a refused call leaves the kept layouts as they were
    policy.close()
    with pytest.raises(UsageError, match="the policy is closed"):
        policy.act(rows[0])  # the short path too
    fresh.close()


def test_act_takes_python_numbers_only_when_nothing_is_lost(cartpole_bundle):
    policy = Policy(cartpole_bundle, runtime="onnxruntime")
    row = [0.01, -0.2, 0.03, 0.1]
    assert policy.act(row) == policy.act(np.asarray(row, np.float32))
    with pytest.raises(FeedError, match="float64 .* given, the policy takes float32"):
        policy.act(np.asarray(row))  # an array says what it holds: never cast
    with pytest.raises(FeedError, match="observation has shape \\[3\\]; the policy takes \\[4\\] .*or \\[n, 4\\]"):
        policy.act(row[:3])
    with pytest.raises(FeedError, match="noise= is for mode='stochastic'"):
        policy.act(row, noise=np.zeros((1, 2), np.float32))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused in one line, not cast to inf with numpy's overflow warning
        with pytest.raises(FeedError, match="values 0 to 1e\\+300.*beyond float32's range .*would become inf"):
            policy.act([1e300, 0.0, 0.0, 0.0])


def test_a_host_side_scaling_bug_fails_at_act_in_the_readmes_loop(dict_bundle, tmp_path):
    """The README's control loop with a team's own /255 before act(): one line at the first act, nothing recorded
    as if it were the device's input."""
    proc = deploy(f"""
        import numpy as np
        import inference
        sys.path.insert(0, {str(Path(fp.__file__).parent)!r})
        import foreign_envs
        env = foreign_envs.make_dict()
        with inference.load({str(dict_bundle.root)!r}, record={str(tmp_path / "rec")!r}) as policy:
            obs, _ = env.reset(seed=0)
            try:
                policy.act({{"vec": obs["vec"], "img": obs["img"] / 255.0}})
            except inference.FeedError as exc:
                print(json.dumps({{"error": str(exc)}}))
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    error = json.loads(proc.stdout.strip().splitlines()[-1])["error"]
    assert error.startswith("observation 'img': float64") and "divided by 255" in error and "\n" not in error


# -- best and its reasons -------------------------------------------------------------------------------------
@needs_runner
def test_best_falls_back_to_onnxruntime_when_the_ms_failed_at_export(cartpole_bundle, tmp_path):
    def ms_failed(m):
        m["graphs"]["policy"]["files"]["ms"]["failed"] = "the .ms disagreed with its Cell"

    copy = edited_copy(cartpole_bundle, tmp_path, ms_failed)
    out = deploy_json(f"""
        import inference
        policy = inference.load({str(copy)!r})
        print(json.dumps({{"runtime": policy.runtime, "file": policy.file.name, "why": policy.runtime_reason}}))
    """)
    assert out["runtime"] == "onnxruntime" and out["file"] == "policy.onnx"
    assert "Lite in this process: bundle" in out["why"] and "policy.ms failed at export" in out["why"]
    proc = subprocess.run([sys.executable, "-m", "inference.play", str(copy), "--episodes", "1"], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("acting with onnxruntime: ONNX Runtime")
    assert "policy.ms failed at export" in proc.stderr


@needs_runner
def test_best_falls_back_when_the_lite_library_does_not_load(cartpole_bundle, tmp_path):
    broken = tmp_path / "libmsrl-lite.so"
    broken.write_bytes(b"not a shared library")
    (tmp_path / "libmsrl-lite-inline.so").write_bytes(b"not a shared library")
    env = {**__import__("os").environ, "MSRL_LITE_LIBRARY": str(broken)}
    out = deploy_json(
        f"""
        import inference
        policy = inference.load({str(cartpole_bundle.root)!r})
        print(json.dumps({{"runtime": policy.runtime, "why": policy.runtime_reason}}))
    """,
        env=env,
    )
    assert out["runtime"] == "onnxruntime" and "does not load here" in out["why"], out


@needs_runner
def test_nothing_that_can_serve_is_exit_3_with_every_reason(cartpole_bundle, tmp_path):
    def all_failed(m):
        for fmt in ("ms", "onnx", "mindir"):
            m["graphs"]["policy"]["files"][fmt]["failed"] = f"{fmt} broke"

    copy = edited_copy(cartpole_bundle, tmp_path, all_failed)
    proc = subprocess.run([sys.executable, "-m", "inference.play", str(copy), "--episodes", "1"], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 3 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: no runtime can serve policy") and "ONNX Runtime: bundle" in proc.stderr


def test_every_deploy_path_loads_the_file_one_rule_chooses(cartpole_bundle, tmp_path):
    """``Bundle.lite_format``: the .mindir where this Lite reads its version, else the .ms; never a failed file."""
    b = cartpole_bundle
    assert b.lite_format("policy", "auto", "2.0.0", 1) == ("ms", "fallback to .ms: MindIR v3, Lite 2.0.0 reads <= v1")
    assert b.lite_format("policy", "auto", "2.3.0", 3)[0] == "mindir"
    assert b.lite_format("policy", "auto")[1] == "fallback to .ms: MindIR v3, cannot tell whether this Lite reads it"

    def mindir_failed(m):
        m["graphs"]["policy"]["files"]["mindir"]["failed"] = "broke"

    copy = load_bundle(edited_copy(b, tmp_path, mindir_failed))
    assert copy.lite_format("policy", "auto", "2.3.0", 3) == ("ms", "the bundle has no usable .mindir")
    from inference.runtimes.base import RuntimeSource
    from inference.runtimes.lite import LiteRuntime

    runtime = LiteRuntime(RuntimeSource(b, None), "policy")
    with Policy(b, runtime="lite-isolated") as policy:
        assert runtime.model_path() == policy.file == b.root / "policy.ms"


# -- deterministic acting of a noise-input graph ---------------------------------------------------------------
def test_a_noise_input_gaussian_policy_acts_deterministically_on_its_squashed_mean(sac_bundle):
    assert sac_bundle.mode_graph("deterministic") == sac_bundle.mode_graph("stochastic") == "policy"
    policy = Policy(sac_bundle, runtime="onnxruntime")
    obs = np.random.default_rng(2).standard_normal((32, 3)).astype(np.float32)
    action, outputs = policy.act_outputs(obs)
    np.testing.assert_allclose(action, np.tanh(outputs["mean"]) * 2, rtol=1e-6)
    np.testing.assert_array_equal(policy.act(obs), action)  # no noise drawn: the same every time
    sampled = Policy(sac_bundle, mode="stochastic", runtime="onnxruntime", seed=1).act(obs)
    assert not np.allclose(sampled, action)


@needs_runner
def test_play_and_verify_act_deterministically_with_a_noise_input_policy(sac_bundle, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "inference.play", str(sac_bundle.root), "--episodes", "1"],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0 and "(deterministic, " in proc.stdout, proc.stderr
    from inference.compare.verifier import VerifyOptions
    from msrl_consistency.api import verify_policy

    result = verify_policy(fp.make_sac, None, sac_bundle.root,
                           options=VerifyOptions(observations=64, episodes=2, runtimes=("onnxruntime",)))  # fmt: skip
    names = {c.name: c.status for c in result.checks if c.runtime == "onnxruntime"}
    assert names["episodes.teacher_forced.deterministic"] == "pass", result.console_table()
    assert names["episodes.free_running.deterministic"] in ("pass", "warn"), result.console_table()
    assert result.exit_code == 0, result.console_table(only_failed=True)


# -- env ids never import ----------------------------------------------------------------------------------------
EVIL = "import pathlib\npathlib.Path(__file__).with_name('imported').write_text('code from a manifest ran')\n"


@needs_runner
@pytest.mark.parametrize("command", ["play", "bench"])
def test_a_manifest_env_id_never_imports_a_module(cartpole_bundle, tmp_path, command):
    (tmp_path / "evilmod.py").write_text(EVIL)
    copy = edited_copy(cartpole_bundle, tmp_path, lambda m: m.update(env_id="evilmod:Evil-v0"))
    extra = ["--batch", "1", "--loops", "2", "--json", str(tmp_path / "b.json")] if command == "bench" else []
    proc = subprocess.run([sys.executable, "-m", f"inference.{command}", str(copy), "--episodes", "1", *extra],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2 and not (tmp_path / "imported").exists(), proc.stderr
    assert proc.stderr.strip() == ("error: env id 'evilmod:Evil-v0' names a module to import; env ids are only looked "
                                   "up among the registered Gymnasium envs: pass your env as --env MODULE:FACTORY to "
                                   "run its code")  # fmt: skip


def test_an_unregistered_env_id_is_refused_without_importing(cartpole_bundle):
    from inference.compare.inputs import env_source

    with pytest.raises(UsageError, match="unknown environment id 'Nope-v9' \\(not registered"):
        env_source("Nope-v9")
    assert env_source("CartPole-v1").max_steps == 500


FORK = """
    import os, signal
    import numpy as np
    import inference
    from inference.lite.common import LiteRunnerError
    policy = inference.load({bundle!r}, runtime={runtime!r})
    obs = np.zeros(4, np.float32)
    before = int(policy.act(obs))
    pid = os.fork()
    if pid == 0:
        signal.alarm(60)  # a child that hangs in the parent's Lite state dies here instead of the test waiting
        try:
            policy.act(obs)
            os._exit(8)  # acted through the parent's Lite state
        except LiteRunnerError as exc:
            ok = "this forked child" in str(exc) and "\\n" not in str(exc)
        policy.close()  # and __del__ at exit: neither touches the parent's Lite
        os._exit(0 if ok else 9)
    _, status = os.waitpid(pid, 0)
    after = int(policy.act(obs))  # the parent's Lite is untouched by the child's close
    policy.close()
    print(json.dumps({{"child": os.waitstatus_to_exitcode(status), "same": before == after}}))
"""


@needs_runner
@pytest.mark.parametrize("runtime", ["lite", "lite-isolated"])
def test_a_forked_child_refuses_its_parents_lite_in_one_line_and_leaves_it_working(cartpole_bundle, runtime):
    """Lite in the process (its threads are not in the child: closing it there hung for good) and the runner
    process (the child's close would have told the parent's runner to quit): the child refuses, the parent acts on."""
    out = deploy_json(FORK.format(bundle=str(cartpole_bundle.root), runtime=runtime))
    assert out == {"child": 0, "same": True}, out
