"""Contract kinds of policies as other teams write them: a Discrete observation through an Embedding (Taxi,
FrozenLake), a distributional Q head (C51), tianshou's ``(logits, None)``, MAPPO's constant ``masks`` input; a
checkpoint saved with its optimizer; ``export --env`` checking the contract against the env before writing."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import foreign_policies as fp
import layer_policies as lp
import mindspore as ms
import numpy as np
import pytest
from cli_inprocess import run_module
from mindspore import Tensor, nn

from inference.bundle import Bundle, load_bundle
from inference.bundle.contract import ContractError, PolicyContract
from inference.bundle.tensors import FeedError
from inference.compare.feeds import comparison_feeds, seeded_feeds
from inference.compare.verifier import VerifyOptions
from inference.errors import UsageError
from inference.lite.common import runner_available
from inference.policy import load
from msrl_consistency.api import export_policy, verify_policy

needs_runner = pytest.mark.skipif(not runner_available()[0], reason=runner_available()[1])
TESTS = Path(__file__).resolve().parent
EVERY_RUNTIME = ("ms-graph", "ms-mindir", "lite", "onnxruntime")


def options(**kwargs) -> VerifyOptions:
    return VerifyOptions(**{"observations": 1000, "episodes": 3, "seed": 2, "required": EVERY_RUNTIME, **kwargs})


def files(bundle) -> set[str]:
    return {fmt for fmt, entry in bundle.graph("policy")["files"].items() if "file" in entry and "failed" not in entry}


def first_layers(result) -> dict[str, str | None]:
    return {runtime: loc.first for runtime, loc in result.localizations.items()}


# -- the contract's new keys ---------------------------------------------------------------------------------------
def test_the_new_kinds_parse_round_trip_and_refuse_what_does_not_fit():
    for data in (lp.FROZENLAKE_CONTRACT, lp.TAXI_CONTRACT, lp.C51_CONTRACT, lp.MASKED_CONTRACT):
        contract = PolicyContract.from_dict(data)
        assert PolicyContract.from_dict(contract.to_dict()) == contract
    lake = PolicyContract.from_dict(lp.FROZENLAKE_CONTRACT)
    assert [(m.name, str(m.dtype), m.shape) for m in lake.input_metas()] == [("obs", "int32", (-1,))]
    masked = PolicyContract.from_dict(lp.MASKED_CONTRACT)
    assert [m.name for m in masked.input_metas()] == ["obs"] and masked.constants[0].name == "masks"
    c51 = PolicyContract.from_dict(lp.C51_CONTRACT)
    dist = np.zeros((2, 2, 51), np.float32)
    dist[0, 1, -1] = dist[0, 0, 25] = 1.0  # row 0: action 1 returns +10, action 0 returns 0
    dist[1, 0, 0] = dist[1, 1, 0] = 0.5
    dist[1, 0, 30] = dist[1, 1, 1] = 0.5  # row 1: action 0 has the larger expectation
    assert c51.env_action({"dist": dist}).tolist() == [1, 0]
    refused = {
        "N >= 2, got 1": {**lp.FROZENLAKE_CONTRACT, "input": {"discrete": 1}},
        "int32 or int64": {**lp.FROZENLAKE_CONTRACT, "input": {"discrete": 16, "dtype": "float32"}},
        "support must be": {**lp.C51_CONTRACT, "action": {**lp.C51_CONTRACT["action"], "support": [1.0, 2.0, 3.0]}},
        "apply to kind 'distributional'": {**lp.CARTPOLE_LOGITS, "action": {**lp.CARTPOLE_LOGITS["action"],
                                                                            "atoms": 51}},
        "constant = <a finite number>": {**lp.CARTPOLE_LOGITS, "input": {"obs": [4], "masks": {"shape": [1]}}},
    }  # fmt: skip
    for message, data in refused.items():
        with pytest.raises(ContractError, match=message.replace("(", r"\(")):
            PolicyContract.from_dict(data)


def test_seeded_feeds_of_a_discrete_observation_are_indices_inside_the_table(tmp_path):
    bundle = export_policy(lp.make_frozenlake(), lp.FROZENLAKE_CONTRACT, tmp_path / "bundle", options=None)
    feeds = seeded_feeds(load_bundle(bundle.root), 300, seed=0)
    assert feeds.obs.dtype == np.int32 and feeds.obs.shape == (300,)
    assert feeds.obs.min() == 0 and feeds.obs.max() == 15 and len(set(feeds.obs.tolist())) == 16
    assert feeds.ordinary.all()  # index 0 and 15 are inputs a policy sees, not synthetic extremes


def test_recorded_observations_of_a_recurrent_policy_start_every_row_at_its_init():
    """Observations recorded without their states (a MARL actor's, no env here): every row is fed the ``init``
    state, not a state batch of another length."""
    contract = PolicyContract.from_dict({"input": {"obs": [3]}, "state": {"h": {"shape": [4], "next": "h_next"}},
                                         "outputs": {"names": ["q", "h_next"]},
                                         "action": {"kind": "argmax", "values": "q"}})  # fmt: skip
    io = {"inputs": [m.to_dict() for m in contract.input_metas()],
          "outputs": [{"name": "q", "dtype": "float32", "shape": [-1, 2]},
                      {"name": "h_next", "dtype": "float32", "shape": [-1, 4]}]}  # fmt: skip
    bundle = Bundle(Path("."), {"graphs": {"policy": {"kind": "deterministic", **io, "contract": contract.to_dict()}}})
    recorded = np.random.default_rng(0).standard_normal((40, 3)).astype(np.float32)
    feeds = comparison_feeds(bundle, 40, 0, recorded, "recorded", 1)
    assert len(feeds.state) == len(feeds.obs) > 40 and not feeds.state["h"].any()
    inputs = feeds.graph_inputs(bundle, "policy")
    assert [len(x) for x in inputs] == [len(feeds.obs)] * 2


# -- Discrete observations through Lite and ONNX Runtime -----------------------------------------------------------
@pytest.fixture(scope="module")
def frozenlake(tmp_path_factory):
    return export_policy(lp.make_frozenlake(), lp.FROZENLAKE_CONTRACT, tmp_path_factory.mktemp("lake") / "bundle")


@needs_runner
def test_an_embedding_policy_on_discrete_observations_verifies_and_a_nudge_is_named(frozenlake):
    assert files(frozenlake) == {"mindir", "onnx", "ms"}
    genuine = verify_policy(lp.make_frozenlake(), None, frozenlake.root, options=options())
    assert genuine.exit_code == 0, genuine.console_table(only_failed=True)
    nudged = verify_policy(fp.nudge(lp.make_frozenlake(), "emb.embedding_table", 0.05), None, frozenlake.root,
                           options=options())  # fmt: skip
    assert nudged.exit_code == 1
    assert {c.runtime for c in nudged.failed} >= {"lite", "onnxruntime"}
    layers = first_layers(nudged)
    assert layers["lite"] == layers["onnxruntime"] == "emb", layers


@needs_runner
def test_a_discrete_policy_acts_on_an_int_and_refuses_an_index_outside_its_table(frozenlake):
    with load(frozenlake.root, runtime="lite-isolated") as policy:
        action = policy.act(5)
        assert np.shape(action) == () and 0 <= int(action) < 4
        assert policy.act(np.array([0, 15], np.int32)).shape == (2,)
        assert policy.act(np.int64(3)) == policy.act(3)  # what Gymnasium's Discrete space hands out
        with pytest.raises(FeedError, match=r"outside the policy's Discrete\(16\) observations"):
            policy.act(16)


def test_verify_refuses_an_array_contract_for_a_discrete_env_naming_the_key(frozenlake, tmp_path):
    contract = {**lp.FROZENLAKE_CONTRACT, "input": {"obs": [1], "dtype": "int32"}}
    with pytest.raises(UsageError) as refused:
        export_policy(lp.make_frozenlake(), contract, tmp_path / "bundle")
    assert "[input] discrete = 16" in str(refused.value) and "Dict" not in str(refused.value)


@pytest.mark.slow
@needs_runner
def test_taxi_v3_runs_as_the_version_gymnasium_registers_in_its_place(tmp_path):
    bundle = export_policy(lp.make_taxi(), lp.TAXI_CONTRACT, tmp_path / "bundle")
    result = verify_policy(lp.make_taxi(), None, bundle.root, options=options())
    assert result.exit_code == 0, result.console_table(only_failed=True)
    assert "Taxi-v4 (for Taxi-v3" in result.inputs["env"], result.inputs


# -- other kinds -----------------------------------------------------------------------------------------------------
@pytest.mark.slow
@needs_runner
@pytest.mark.parametrize("case", ["c51", "no_state", "masked"])
def test_distributional_none_and_constant_input_policies_verify_and_fail_when_nudged(tmp_path, case):
    factory, contract = {"c51": (lp.make_c51, lp.C51_CONTRACT), "no_state": (lp.make_no_state, lp.CARTPOLE_LOGITS),
                         "masked": (lp.make_masked, lp.MASKED_CONTRACT)}[case]  # fmt: skip
    bundle = export_policy(factory(), contract, tmp_path / "bundle")
    assert files(bundle) == {"mindir", "onnx", "ms"}
    assert [i["name"] for i in bundle.graph("policy")["inputs"]] == ["obs"]  # masks are fed inside the graphs
    genuine = verify_policy(factory(), None, bundle.root, options=options())
    assert genuine.exit_code == 0, genuine.console_table(only_failed=True)
    nudged = verify_policy(fp.nudge(factory(), "fc1.weight" if case != "c51" else "fc.weight", 0.5), None,
                           bundle.root, options=options())  # fmt: skip
    assert nudged.exit_code == 1 and {c.runtime for c in nudged.failed} >= {"lite", "onnxruntime"}


# -- checkpoints saved by MindSpore's training loop -----------------------------------------------------------------
def optimizer_checkpoint(path: Path, extra: dict | None = None) -> Path:
    """The LayerNorm policy trained one step with Adam, saved as MindSpore's loops save it: the train step (network
    and optimizer state) with ``append_dict`` counters."""
    net = lp.make_layernorm()
    step = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.Adam(net.trainable_params(), 1e-2))
    step(Tensor(np.ones((2, 4), np.float32)), Tensor(np.zeros((2, 2), np.float32)))
    ms.save_checkpoint(step, str(path), append_dict={"epoch_num": 3, "step": 30, **(extra or {})})
    return path


def test_a_checkpoint_with_optimizer_state_exports_and_lists_what_it_ignored(tmp_path):
    ckpt = optimizer_checkpoint(tmp_path / "policy.ckpt")
    bundle = export_policy(lp.make_layernorm, lp.CARTPOLE_LOGITS, tmp_path / "bundle", checkpoint=ckpt)
    ignored = set(bundle.manifest["source"]["checkpoint_ignored"])
    assert {"epoch_num", "step", "learning_rate", "beta1_power", "moment1.fc1.weight", "moment2.ln.gamma"} <= ignored
    assert not ignored & {"fc1.weight", "ln.gamma", "fc2.bias"}
    trained = VerifyOptions(observations=200, episodes=1, runtimes=("ms-mindir",), required=("ms-mindir",))
    loaded = verify_policy(lp.make_layernorm, None, bundle.root, checkpoint=ckpt, options=trained)
    assert loaded.exit_code == 0, loaded.console_table(only_failed=True)  # the bundle holds the trained weights
    untrained = verify_policy(lp.make_layernorm, None, bundle.root, options=trained)
    assert untrained.exit_code == 1
    unknown = optimizer_checkpoint(tmp_path / "other.ckpt", {"critic.fc1.weight": Tensor(np.ones(3, np.float32))})
    with pytest.raises(UsageError, match=r"unexpected \['critic.fc1.weight'\].*MindSpore adds"):
        export_policy(lp.make_layernorm, lp.CARTPOLE_LOGITS, tmp_path / "refused", checkpoint=unknown)


# -- export --env ----------------------------------------------------------------------------------------------------
def export_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_module("msrl_consistency.export", "--cell", "layer_policies:make_no_state", "--out", "bundle", *args,
                      cwd=cwd)  # fmt: skip


def test_export_env_checks_the_contract_against_the_env_before_writing(tmp_path):
    shutil.copy(TESTS / "layer_policies.py", tmp_path)
    (tmp_path / "envs.py").write_text("import gymnasium as gym\n\ndef make():\n    return gym.make('Acrobot-v1')\n")
    (tmp_path / "contract.toml").write_text('[input]\nobs = [4]\n[outputs]\nnames = ["logits"]\n[action]\n'
                                            'kind = "categorical"\nlogits = "logits"\n')  # fmt: skip
    refused = export_cli(tmp_path, "--contract", "contract.toml", "--env", "envs:make")
    assert refused.returncode == 2 and not (tmp_path / "bundle").exists()
    lines = refused.stderr.strip().splitlines()
    assert lines[-1] == "error: contract vs env envs:make: observation 'obs' is [6], the contract says [4]", lines
    assert "Traceback" not in refused.stderr and "internal error" not in refused.stderr
    proc = export_cli(tmp_path, "--contract", "contract.toml", "--env", "CartPole-v1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert manifest["env_id"] == "CartPole-v1" and manifest["graphs"]["policy"]["contract"]["env_id"] == "CartPole-v1"
