"""The audit of a field recording passes only what it should: every chunk there once, the env actions the device
took, the steps it acted on NaN observations, every time window, one line for a malformed chunk; and it streams the
recording one chunk at a time, reporting what one whole comparison would."""

from __future__ import annotations

import gc
import json
import shutil
import weakref
from collections.abc import Callable
from pathlib import Path

import lite_build
import numpy as np
import pytest
from test_field import audit, device, report

from inference.bundle import sha256_file
from inference.bundle.recording import index_recording, read_recording
from inference.bundle.recording.chunk import chunk_name, write_chunk
from inference.errors import UsageError
from inference.field import Recorder

pytestmark = pytest.mark.skipif(not lite_build.BUILT and not lite_build.required(), reason=lite_build.WHY_NOT)

STEPS, CHUNK = 6000, 1000
LOOP = """
    import numpy as np
    import gymnasium as gym
    import inference
    policy = inference.load({bundle!r}, record={out!r}, chunk_steps={chunk})
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    for t in range(1, {steps} + 1):
        if {nan_every} and t % {nan_every} == 0:  # a sensor that sometimes reads NaN
            obs = obs.copy()
            obs[2] = np.nan
        obs, reward, terminated, truncated, _ = env.step(int(policy.act(obs)))
        policy.observe(reward, terminated or truncated)
        if terminated or truncated:
            obs, _ = env.reset()
    policy.close()
"""


def record(bundle, out: Path, nan_every: int = 0) -> Path:
    proc = device(LOOP.format(bundle=str(bundle.root), out=str(out), chunk=CHUNK, steps=STEPS, nan_every=nan_every))
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def recording(cartpole_bundle, tmp_path_factory) -> Path:
    """6,000 CartPole steps of Lite in a device process, in 6 chunks."""
    return record(cartpole_bundle, tmp_path_factory.mktemp("field") / "rec")


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".recorder.lock"))
    return dst


def rewrite(path: Path, change: Callable[[dict, dict], None], rechain: bool = True) -> None:
    """Change a chunk's arrays or meta in place (``change(arrays, meta)``), as a faulty device would have written it:
    the chunks after it in its directory name the new file (``previous``), unless ``rechain`` is off (a tampering
    hand, which the chain then gives away)."""
    with np.load(path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files if k != "meta"}
        meta = json.loads(str(data["meta"]))
    change(arrays, meta)
    write_chunk(path, arrays, meta)
    after = path.with_name(chunk_name(int(meta.get("chunk", -2)) + 1))
    if rechain and after.is_file():
        digest = sha256_file(path)
        rewrite(after, lambda _a, m: m.__setitem__("previous", {"chunk": meta["chunk"], "sha256": digest}))


def checks(out: Path) -> dict:
    return {c["name"]: c for c in report(out)["checks"]}


def test_a_genuine_recording_streams_to_a_pass(cartpole_bundle, cartpole_ckpt, recording, tmp_path):
    assert audit(cartpole_bundle.root, cartpole_ckpt, recording, tmp_path / "r") == 0
    found = checks(tmp_path / "r")
    observations, recorded = found["observations.policy"], found["field.recording"]
    assert observations["status"] == "pass" and "in 6 chunk(s)" in observations["summary"]
    assert recorded["status"] == "pass" and "6 chunks, 6000 steps" in recorded["summary"]
    assert found["field.actions"]["summary"].startswith("all 6000 recorded env actions are what the training path")
    assert found["field.nonfinite_observations"]["summary"] == "no NaN or inf observation in 6000 steps"
    assert found["field.drift"]["status"] == "pass" and "within tolerance in every window" in found["field.drift"][
        "summary"]  # fmt: skip
    facts = json.loads((tmp_path / "r" / "audit.json").read_text())
    assert facts["steps"] == 6000 and facts["chunks"] == 6 and facts["actions"]["differ"] == 0
    assert report(tmp_path / "r")["options"]["observations"] == 6000


def test_flipped_actions_fail_with_the_steps(cartpole_bundle, cartpole_ckpt, recording, tmp_path):
    rec = copy(recording, tmp_path / "rec")

    def flip(arrays: dict, meta: dict) -> None:
        arrays["action"][100:150] = 1 - arrays["action"][100:150]

    rewrite(rec / chunk_name(2), flip)
    assert audit(cartpole_bundle.root, cartpole_ckpt, rec, tmp_path / "r") == 1
    found = checks(tmp_path / "r")
    actions = found["field.actions"]
    assert actions["status"] == "fail" and actions["summary"].startswith("50 of 6000 recorded env actions are not")
    assert "first at step 2100" in actions["summary"] and actions["metrics"]["examples"][0]["step"] == 2100
    assert actions["diagnosis"]["stage"] == "post-processing"  # the device's own outputs give the other action
    assert found["observations.policy"]["status"] == "pass"  # the graph answered as training's


def test_a_gap_or_a_chunk_twice_is_one_line(cartpole_bundle, recording, tmp_path):
    gap = copy(recording, tmp_path / "gap")
    (gap / chunk_name(3)).unlink()
    twice = copy(recording, tmp_path / "twice")
    shutil.copy(twice / chunk_name(1), twice / chunk_name(6))
    cases = [
        ([gap], r"gap: chunk-000003.npz is missing"),
        ([twice], r"chunk-000006.npz holds chunk 1 of its recording"),
        ([recording, recording], "are the same chunk"),
        ([gap / chunk_name(2), gap / chunk_name(2)], "are the same chunk"),
    ]
    for paths, message in cases:
        with pytest.raises(UsageError, match=message) as caught:
            index_recording(paths, cartpole_bundle)
        assert "\n" not in str(caught.value)
    assert index_recording([gap / chunk_name(k) for k in (0, 1, 2, 4)], cartpole_bundle).steps == 4000  # as named


def test_a_continued_recording_audits_as_one_sequence(cartpole_bundle, cartpole_ckpt, recording, tmp_path):
    rec = copy(recording, tmp_path / "rec")
    proc = device(LOOP.format(bundle=str(cartpole_bundle.root), out=str(rec), chunk=CHUNK, steps=1500, nan_every=0))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert audit(cartpole_bundle.root, cartpole_ckpt, rec, tmp_path / "r") == 0
    found = checks(tmp_path / "r")
    assert "8 chunks, 7500 steps" in found["field.recording"]["summary"]
    assert "2 recording sessions, continued in one sequence" in found["field.recording"]["summary"]
    episodes = read_recording([rec], cartpole_bundle).episode_returns()
    assert len({e for e, _, _ in episodes}) == len(episodes) and max(r for *_, r in episodes) <= 500


def test_a_clock_set_back_is_said_and_the_windows_keep_the_steps_order(cartpole_bundle, cartpole_ckpt, recording,
                                                                          tmp_path):  # fmt: skip
    rec = copy(recording, tmp_path / "rec")
    rewrite(rec / chunk_name(3), lambda a, _m: a.__setitem__("time_ns", a["time_ns"] - np.int64(3_600 * 10**9)))
    assert audit(cartpole_bundle.root, cartpole_ckpt, rec, tmp_path / "r") == 0  # a warning: the policy agrees
    drift = checks(tmp_path / "r")["field.drift"]
    assert drift["status"] == "warn" and drift["metrics"]["clock_went_back"] == 1, drift["summary"]
    assert "clock went back at 1 step(s)" in drift["summary"] and " s)" not in drift["summary"]
    starts = [w["start_step"] for w in drift["metrics"]["windows"]]
    assert starts == sorted(starts)


def test_a_chunk_of_another_recording_of_the_same_bundle_is_refused(cartpole_bundle, recording, tmp_path):
    """Each chunk names the file written before it: another recording's chunk 1 under this one's name breaks the
    chain, whichever side of it the audit reads (the chunk itself, and the chunk after it)."""
    other = tmp_path / "other"
    proc = device(LOOP.format(bundle=str(cartpole_bundle.root), out=str(other), chunk=CHUNK, steps=2000, nan_every=0))
    assert proc.returncode == 0, proc.stderr[-2000:]
    spliced = copy(recording, tmp_path / "spliced")
    shutil.copyfile(other / chunk_name(1), spliced / chunk_name(1))
    with pytest.raises(UsageError, match=r"chunk-000001.npz does not follow chunk-000000.npz here"):
        index_recording([spliced], cartpole_bundle)
    shutil.copyfile(other / chunk_name(0), spliced / chunk_name(0))  # both of its chunks: now chunk 2 does not follow
    with pytest.raises(UsageError, match=r"chunk-000002.npz does not follow chunk-000001.npz here"):
        index_recording([spliced], cartpole_bundle)
    assert index_recording([recording], cartpole_bundle).chunks[1].meta["previous"]["chunk"] == 0


@pytest.mark.parametrize("where", ["middle", "end"])
def test_the_drift_check_judges_every_window(cartpole_bundle, cartpole_ckpt, recording, tmp_path, where):
    """A window beyond tolerance fails, wherever it is, and is named; a rise within tolerance is a warning."""
    steps = range(2400, 3000) if where == "middle" else range(5400, 6000)  # window 5 or 10 of 10
    for name, shift, status, code in (("far", 0.5, "fail", 1), ("rise", 5e-5, "warn", 0)):  # 5000x, 0.5x the atol
        rec = copy(recording, tmp_path / f"{name}-rec")

        def shift_logits(arrays: dict, meta: dict, lo: int = steps.start % CHUNK, d: float = shift) -> None:
            arrays["output/logits"][lo : lo + 600] += np.float32(d)

        rewrite(rec / chunk_name(steps.start // CHUNK), shift_logits)  # rows 400-999 of chunk 2 or 5
        assert audit(cartpole_bundle.root, cartpole_ckpt, rec, tmp_path / f"{name}-r") == code
        drift = checks(tmp_path / f"{name}-r")["field.drift"]
        window = 5 if where == "middle" else 10
        assert drift["status"] == status and drift["metrics"]["worst_window"] == window - 1, drift["summary"]
        assert f"window {window} (steps {steps.start}-{steps.stop - 1}" in drift["summary"]
        if status == "fail":
            assert "beyond tolerance in 1 of them" in drift["summary"] and "5e+03x the tolerance" in drift["summary"]


def test_nan_steps_are_compared_and_counted(cartpole_bundle, cartpole_ckpt, tmp_path):
    """Lite maps a NaN observation to finite logits as the Cell does: counted and reported with what the device did;
    a device answering NaN there (as ONNX Runtime does) fails."""
    rec = record(cartpole_bundle, tmp_path / "rec", nan_every=100)
    assert audit(cartpole_bundle.root, cartpole_ckpt, rec, tmp_path / "r") == 0
    nan = checks(tmp_path / "r")["field.nonfinite_observations"]
    assert nan["status"] == "warn" and nan["metrics"]["nan_steps"] == 60 and nan["metrics"]["first_step"] == 99
    assert nan["metrics"]["nan_dimensions"] == [{"dimension": "dimension 2", "steps": 60}]
    assert "60 of 6000 steps (1.00%) had NaN (60)" in nan["summary"] and "the device acted on them" in nan["summary"]
    assert sum(nan["metrics"]["actions_taken"].values()) == 60

    def nan_answers(arrays: dict, meta: dict) -> None:
        rows = np.isnan(arrays["input/0"]).any(1)
        arrays["output/logits"][rows] = np.nan

    for path in sorted(rec.glob("chunk-*.npz")):
        rewrite(path, nan_answers)
    assert audit(cartpole_bundle.root, cartpole_ckpt, rec, tmp_path / "r2") == 1
    nan = checks(tmp_path / "r2")["field.nonfinite_observations"]
    assert nan["status"] == "fail" and nan["metrics"]["device_answered_nan"] == 60
    assert nan["metrics"]["outputs"]["logits"]["nan_mismatches"] == 120 and "logits 120/120" in nan["summary"]


def test_the_merged_checks_are_the_whole_comparison(cartpole_bundle, cartpole_ckpt, recording, tmp_path):
    """6 chunks compared one by one report what one chunk of all 6,000 steps reports."""
    rng = np.random.default_rng(0)
    rows = np.sort(rng.choice(STEPS, 30, replace=False))
    split = copy(recording, tmp_path / "split")
    for k in range(6):

        def nudge(arrays: dict, meta: dict, k: int = k) -> None:
            mine = rows[(rows >= k * CHUNK) & (rows < (k + 1) * CHUNK)] - k * CHUNK
            arrays["output/logits"][mine, 0] += np.float32(0.01) * (1 + np.arange(len(mine), dtype=np.float32))

        rewrite(split / chunk_name(k), nudge)
    whole = tmp_path / "whole"
    whole.mkdir()
    parts = [np.load(split / chunk_name(k)) for k in range(6)]
    arrays = {k: np.concatenate([p[k] for p in parts]) for k in parts[0].files if k != "meta"}
    meta = {**json.loads(str(parts[0]["meta"])), "steps": STEPS, "chunk": 0}
    write_chunk(whole / chunk_name(0), arrays, meta)
    for name in ("split", "whole"):
        assert audit(cartpole_bundle.root, cartpole_ckpt, tmp_path / name, tmp_path / f"r-{name}") == 1
    a, b = (checks(tmp_path / f"r-{name}")["observations.policy"] for name in ("split", "whole"))
    assert a["status"] == b["status"] == "fail" and a["diagnosis"] == b["diagnosis"]
    for key in ("count", "mismatches", "first_mismatch", "max_abs", "max_rel", "nan_mismatches", "required_atol"):
        assert a["metrics"]["outputs"]["logits"][key] == b["metrics"]["outputs"]["logits"][key], key
    assert a["metrics"]["outputs"]["logits"]["mismatches"] == 30
    assert a["metrics"]["flips"]["flips"] == b["metrics"]["flips"]["flips"]
    assert a["metrics"]["flips"]["rows"] == b["metrics"]["flips"]["rows"]  # steps of the recording, not of a chunk
    assert a["metrics"]["kl"]["max"] == pytest.approx(b["metrics"]["kl"]["max"])
    assert a["metrics"]["kl"]["mean"] == pytest.approx(b["metrics"]["kl"]["mean"], rel=1e-6)


def test_the_audit_holds_one_chunk_at_a_time(cartpole_bundle, cartpole_ckpt, recording, monkeypatch):
    """Streaming, not a threshold: when a chunk is read, at most the one before it is still alive."""
    import inference.compare.audit as audit_module
    from msrl_consistency.artifacts.cells import TrainerCells
    from msrl_consistency.audit import audit_recordings

    real, alive, most = audit_module.read_chunk, [], []

    def tracked(info, layout):
        gc.collect()
        most.append(sum(r() is not None for r in alive))
        chunk = real(info, layout)
        alive.append(weakref.ref(chunk))
        return chunk

    monkeypatch.setattr(audit_module, "read_chunk", tracked)
    cells = TrainerCells(cartpole_ckpt, cartpole_bundle.policy_spec)
    result, facts = audit_recordings(cartpole_bundle, [recording], cells, cartpole_ckpt)
    assert result.exit_code == 0 and facts.steps == STEPS and len(most) == 6 and max(most) <= 1


def test_host_sampled_actions_are_judged_with_the_recorded_noise(cartpole_bundle, cartpole_ckpt, tmp_path):
    """The deterministic graph sampled on the host (Gumbel-max with recorded uniform noise): the audit draws the same
    sample from training's outputs; an action that ignored the noise fails."""
    from inference.policy import OnnxModel

    model = OnnxModel(cartpole_bundle.file("policy", "onnx"))
    contract = cartpole_bundle.contract("policy")
    rng = np.random.default_rng(3)
    for name, sample in (("sampled", True), ("argmax", False)):
        with Recorder(tmp_path / name, cartpole_bundle, "policy", "onnxruntime", chunk_steps=500) as rec:
            for _ in range(40):
                obs = (rng.standard_normal((32, 4)) * 0.3).astype(np.float32)
                outputs = model.infer(obs)
                noise = cartpole_bundle.sample_noise("policy", rng, 32)
                action = contract.env_action(outputs, host_noise=noise) if sample else contract.env_action(outputs)
                rec.record([obs], outputs, action, host_noise=noise)
                rec.observe(np.ones(32), np.zeros(32, bool))
        code = audit(cartpole_bundle.root, cartpole_ckpt, tmp_path / name, tmp_path / f"r-{name}")
        actions = checks(tmp_path / f"r-{name}")["field.actions"]
        if sample:
            assert code == 0 and "(1280 sampled with the recorded noise)" in actions["summary"], actions["summary"]
        else:
            assert code == 1 and actions["status"] == "fail" and actions["diagnosis"]["stage"] == "post-processing"
            assert actions["metrics"]["differ"] > 100


def _write_raw(path: Path, arrays: dict, meta: object) -> None:
    """A chunk as a careless or hostile writer makes it: any meta, any arrays (numpy's own writer)."""
    np.savez(path, meta=meta if isinstance(meta, np.ndarray) else np.array(meta), **arrays)


MALFORMED: list[tuple[str, Callable[[dict, dict], object], str]] = [
    ("no action", lambda a, m: a.__delitem__("action"), "no field 'action'"),
    ("no input", lambda a, m: a.__delitem__("input/0"), "no field 'input/0'"),
    ("float episodes", lambda a, m: a.__setitem__("episode", a["episode"].astype(np.float64)),
     "field 'episode' is float64, expected int64"),
    ("float64 observations", lambda a, m: a.__setitem__("input/0", a["input/0"].astype(np.float64)),
     "field 'input/0' is float64, expected float32"),
    ("float actions", lambda a, m: a.__setitem__("action", a["action"].astype(np.float32)),
     "field 'action' is float32, expected int32"),
    ("2-d rewards", lambda a, m: a.__setitem__("reward", np.stack([a["reward"]] * 2, 1)), "field 'reward' has shape"),
    ("short time", lambda a, m: a.__setitem__("time_ns", a["time_ns"][:-1]), "field 'time_ns' has shape"),
    ("wide logits", lambda a, m: a.__setitem__("output/logits", np.zeros((len(a["action"]), 3), np.float32)),
     "field 'output/logits' has shape"),
    ("extra output", lambda a, m: a.__setitem__("output/extra", a["reward"]), "field 'output/extra' is not part of"),
    ("pickled dones", lambda a, m: a.__setitem__("done", a["done"].astype(object)),
     "field 'done' holds Python objects"),
    ("meta not JSON", lambda a, m: "{not json", "field 'meta' is not valid JSON"),
    ("meta a list", lambda a, m: json.dumps([m]), "field 'meta' is a JSON list, not an object"),
    ("meta an int array", lambda a, m: np.arange(3), "field 'meta' is int64[3], not a JSON string"),
    ("chunk a string", lambda a, m: json.dumps({**m, "chunk": "0"}), "meta 'chunk' is str"),
    ("steps a bool", lambda a, m: json.dumps({**m, "steps": True}), "meta 'steps' is bool"),
    ("negative drops", lambda a, m: json.dumps({**m, "dropped_steps": -1}), "meta 'dropped_steps' is -1, out of range"),
    ("hash a number", lambda a, m: json.dumps({**m, "manifest_sha256": 123}), "meta 'manifest_sha256' is int"),
    ("graph a list", lambda a, m: json.dumps({**m, "graph": ["policy"]}), "meta 'graph' is list"),
    ("no graph", lambda a, m: json.dumps({k: v for k, v in m.items() if k != "graph"}), "meta has no 'graph'"),
    ("bad lost entry", lambda a, m: json.dumps({**m, "lost": [{"chunk": "x"}]}), "meta 'lost' holds"),
    ("duplicate key", lambda a, m: json.dumps(m)[:-1] + ', "graph": "policy_sample"}', "duplicate key 'graph'"),
    ("other version", lambda a, m: json.dumps({**m, "version": 99}), "field-recording chunk of version 1 or 2"),
    ("steps mismatch", lambda a, m: json.dumps({**m, "steps": m["steps"] + 1}), "with 1001 steps (meta 'steps')"),
    ("negative episode", lambda a, m: a["episode"].__setitem__(3, -5), "field 'episode' is -5 at step 3"),
    ("negative env", lambda a, m: a["env"].__setitem__(0, -1), "field 'env' is -1 at step 0"),
    ("time at int64's end", lambda a, m: a["time_ns"].__setitem__(7, np.iinfo(np.int64).max),
     "field 'time_ns' is 9223372036854775807 at step 7"),
    ("time before 1970", lambda a, m: a["time_ns"].__setitem__(2, np.iinfo(np.int64).min), "field 'time_ns' is -9"),
]  # fmt: skip


@pytest.mark.parametrize("change, message", [(c, m) for _, c, m in MALFORMED], ids=[n for n, _, _ in MALFORMED])
def test_a_malformed_chunk_is_one_line_naming_the_field(cartpole_bundle, recording, tmp_path, change, message):
    with np.load(recording / chunk_name(0), allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files if k != "meta"}
        meta = json.loads(str(data["meta"]))
    changed = change(arrays, meta)
    target = tmp_path / "rec" / chunk_name(0)
    target.parent.mkdir()
    _write_raw(target, arrays, json.dumps(meta) if changed is None or not isinstance(changed, str | np.ndarray)
               else changed)  # fmt: skip
    with pytest.raises(UsageError) as caught:
        read_recording([target.parent], cartpole_bundle)
    text = str(caught.value)
    assert message in text and chunk_name(0) in text and "\n" not in text, text


@pytest.mark.slow
def test_a_noise_input_policy_audits_in_both_modes(tmp_path):
    """A SAC-style graph that samples from its noise input, recorded through ``inference.load`` acting
    deterministically (zero noise, the squashed mean) and stochastically (seeded noise): both audit as consistent,
    every recorded action judged."""
    import foreign_policies as fp

    import inference
    from msrl_consistency.api import export_policy
    from msrl_consistency.artifacts.cells import UserCells
    from msrl_consistency.audit import audit_recordings

    bundle = export_policy(fp.make_sac(), fp.SAC_CONTRACT, tmp_path / "bundle")
    rng = np.random.default_rng(0)
    for mode in ("deterministic", "stochastic"):
        with inference.load(bundle, runtime="onnxruntime", mode=mode, seed=1, record=tmp_path / mode) as policy:
            for _ in range(50):
                policy.act(rng.standard_normal((8, 3)).astype(np.float32))
                policy.observe(np.zeros(8), np.zeros(8, bool))
        result, facts = audit_recordings(bundle, [tmp_path / mode], UserCells(fp.make_sac, None), None)
        actions = next(c for c in result.checks if c.name == "field.actions")
        assert result.exit_code == 0, result.console_table()
        assert actions.status == "pass" and facts.actions["steps"] == 400 and facts.actions["differ"] == 0


def test_an_episode_with_a_nan_or_inf_reward_stays_and_is_named_not_averaged():
    """A 408-step episode with one NaN reward, then a 500-step one: the audit does not read a min return of 500 as
    if the first never happened; it names it and warns."""
    from types import SimpleNamespace

    from inference.compare.audit.field_checks import Returns

    reward = np.ones(908)
    reward[100] = np.nan
    done = np.zeros(908, bool)
    done[[407, 907]] = True
    chunk = SimpleNamespace(env=np.zeros(908, np.int64), episode=np.r_[np.zeros(408), np.ones(500)].astype(np.int64),
                            reward=reward, done=done)  # fmt: skip
    returns = Returns()
    returns.add(0, chunk)
    facts = returns.facts([])
    assert facts["episodes"] == 1 and facts["min"] == 500.0 and facts["non_finite"] == 1
    assert facts["non_finite_episodes"][0] == {"episode": 0, "env": 0, "finite_sum": 407.0}
    check = returns.check("field:lite", facts)
    assert check.status == "warn" and "episode 0 env 0" in check.summary and "NaN or inf" in check.summary
    reward[100] = np.inf
    inf = Returns()
    inf.add(0, chunk)
    assert inf.check("field:lite", inf.facts([])).status == "warn"
