"""The policy contract: parsing with clear errors, action derivation per kind, and our graphs as instances."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from mindspore import Tensor

from inference.bundle import BundleError, load_bundle
from inference.bundle.contract import ContractError, PolicyContract, gumbel_argmax
from inference.bundle.tensors import TensorMeta
from msrl_consistency.agent import PolicySpec
from msrl_consistency.artifacts.graphs import trainer_contracts

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "bring-your-own"
GAUSSIAN = {
    "env_id": "Pendulum-v1",
    "input": {"obs": [3]},
    "outputs": {"names": ["mean", "std"]},
    "action": {"kind": "gaussian", "mean": "mean", "std": "std", "squash": "clip", "low": [-2.0], "high": [2.0]},
}


def with_action(**changes):
    data = json.loads(json.dumps(GAUSSIAN))
    data["action"].update(changes)
    return data


def test_every_shipped_contract_parses_and_round_trips():
    files = sorted(EXAMPLES.rglob("*.toml"))
    assert len(files) >= 3  # the reference and one per example
    for path in files:
        contract = PolicyContract.from_toml(path)
        assert PolicyContract.from_dict(contract.to_dict()) == contract, path


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({**GAUSSIAN, "extra": 1}, "unknown key"),
        (with_action(kind="beta"), "kind must be one of"),
        (with_action(std=None, log_std=None), "exactly one of std or log_std"),
        (with_action(mean="mu"), "'mu' is not one of the outputs"),
        (with_action(low=[2.0], high=[-2.0]), "low < high"),
        (with_action(low=None, high=None), "needs low and high"),
        (with_action(squash="sigmoid"), "squash must be one of"),
        ({**GAUSSIAN, "input": {"obs": [0]}}, "shape without the batch dim"),
        ({**GAUSSIAN, "input": {"obs": [3], "noise": [1]}}, "noise_kind"),
        ({k: v for k, v in GAUSSIAN.items() if k != "outputs"}, "missing table"),
        # names the runtimes, the report page and recordings carry: printable, bounded
        ({**GAUSSIAN, "outputs": {"names": ["mean", "a\u0000b"]}}, "names: 'a.x00b' is not a usable name"),
        ({**GAUSSIAN, "outputs": {"names": ["mean", "two\nlines"]}}, "not a usable name"),
        ({**GAUSSIAN, "outputs": {"names": ["mean", "x" * 129]}}, "not a usable name"),
    ],
)
def test_malformed_contracts_say_what_is_wrong(data, message):
    with pytest.raises(ContractError, match=message):
        PolicyContract.from_dict(data)


def test_contract_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "c.toml"
    bad.write_text("[input\nobs = [3]")
    with pytest.raises(ContractError, match="c.toml is not valid TOML"):
        PolicyContract.from_toml(bad)
    with pytest.raises(ContractError, match="not found"):
        PolicyContract.from_toml(tmp_path / "missing.toml")


def test_gaussian_actions_deterministic_sampled_and_squashed():
    c = PolicyContract.from_dict(GAUSSIAN)
    outs = {"mean": np.array([[0.5], [3.0]], np.float32), "std": np.array([0.5], np.float32)}
    np.testing.assert_array_equal(c.env_action(outs), [[0.5], [2.0]])  # clipped to the bounds
    noise = np.array([[1.0], [-20.0]], np.float32)
    np.testing.assert_allclose(c.env_action(outs, noise), [[1.0], [-2.0]])  # mean + std * noise, clipped
    tanh = PolicyContract.from_dict(with_action(squash="tanh", std=None, log_std=[0.0]))
    np.testing.assert_allclose(tanh.env_action(outs), 2.0 * np.tanh(outs["mean"]), rtol=1e-6)
    rescaled = PolicyContract.from_dict(with_action(rescale=True))
    np.testing.assert_allclose(rescaled.env_action(outs), [[1.0], [2.0]])  # [-1, 1] mapped onto [-2, 2]


def test_argmax_and_categorical_actions():
    base = {"input": {"obs": [4]}, "outputs": {"names": ["q"]}}
    argmax = PolicyContract.from_dict({**base, "action": {"kind": "argmax", "values": "q"}})
    q = np.array([[0.1, 0.2], [3.0, -1.0]], np.float32)
    assert argmax.env_action({"q": q}).tolist() == [1, 0] and argmax.stochastic_noise_kind is None
    with pytest.raises(ContractError, match="do not sample on the host"):
        argmax.env_action({"q": q}, np.zeros((2, 2), np.float32))
    categorical = PolicyContract.from_dict({**base, "action": {"kind": "categorical", "logits": "q"}})
    assert categorical.samples_on_host and categorical.stochastic_noise_kind == "uniform"
    rng = np.random.default_rng(0)
    logits = np.log(np.array([[0.2, 0.8]] * 20000, np.float32))
    draws = categorical.env_action({"q": logits}, rng.random(logits.shape, dtype=np.float32))
    assert abs(draws.mean() - 0.8) < 0.01  # Gumbel-max samples from the softmax


def test_host_gumbel_agrees_with_the_graphs_up_to_near_ties():
    """The host sampler is the graphs' Gumbel-max; they differ only where MindSpore's CPU log (error ~1e-7 near 1,
    a few ULPs elsewhere) reorders two perturbed logits that are within 1e-4 of each other."""
    from msrl_consistency.agent import distributions as D

    rng = np.random.default_rng(3)
    logits = rng.standard_normal((4096, 5)).astype(np.float32)
    uniform = rng.random((4096, 5), dtype=np.float32)
    uniform[:3] = [0.0, 1.0, 1e-9, 0.5, 0.99999988]  # the clamped ends stay finite in both
    in_graph = D.gumbel_argmax(Tensor(logits), Tensor(uniform)).asnumpy()
    host = gumbel_argmax(logits, uniform)
    u = np.clip(uniform, 1e-6, 1 - 1e-6).astype(np.float64)
    perturbed = np.sort(logits - np.log(-np.log(u)), -1)
    near_tie = perturbed[:, -1] - perturbed[:, -2] < 1e-4
    assert np.array_equal(host[~near_tie], in_graph[~near_tie])
    assert (host != in_graph).sum() <= near_tie.sum() and np.isfinite(perturbed).all()


def test_check_io_rejects_outputs_that_do_not_fit_their_roles():
    c = PolicyContract.from_dict(GAUSSIAN)
    f32 = np.dtype("float32")
    c.check_io([TensorMeta("a", f32, (-1, 1)), TensorMeta("b", f32, (1,))])  # a state-independent std is fine
    with pytest.raises(ContractError, match="returns 1 output"):
        c.check_io([TensorMeta("a", f32, (-1, 1))])
    with pytest.raises(ContractError, match="gaussian mean output 'mean' has shape"):
        c.check_io([TensorMeta("a", f32, (1, 1)), TensorMeta("b", f32, (1,))])  # no batch dim
    with pytest.raises(ContractError, match="std output 'std'"):
        c.check_io([TensorMeta("a", f32, (-1, 1)), TensorMeta("b", f32, (-1, 3))])
    with pytest.raises(ContractError, match="dtype"):
        c.check_io([TensorMeta("a", np.dtype("int32"), (-1, 1)), TensorMeta("b", f32, (1,))])


def test_our_graphs_are_contract_instances(cartpole_bundle, pendulum_bundle):
    for bundle in (cartpole_bundle, pendulum_bundle):
        spec, log_std = PolicySpec.from_dict(bundle.policy_spec), bundle.manifest["gaussian_log_std"]
        expected = trainer_contracts(spec, log_std, bundle.env_id)
        assert {g: bundle.contract(g) for g in bundle.graphs} == expected
        assert bundle.mode_graph("deterministic") == "policy" and bundle.mode_graph("stochastic") == "policy_sample"


def test_schema_v1_bundles_still_load(cartpole_bundle, tmp_path):
    old = tmp_path / "v1"
    shutil.copytree(cartpole_bundle.root, old)
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["schema_version"] = 1
    for graph in manifest["graphs"].values():
        del graph["contract"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    bundle = load_bundle(old)
    assert {g: bundle.contract(g) for g in bundle.graphs} == {g: cartpole_bundle.contract(g) for g in bundle.graphs}
    manifest["policy_spec"] = None  # v1 manifests are checked against the schema's types too
    (old / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="field policy_spec: expected object, got null"):
        load_bundle(old)
    del manifest["policy_spec"]
    (old / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="no usable policy contract"):
        load_bundle(old)
