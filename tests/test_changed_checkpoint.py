"""A checkpoint other than the one a bundle was exported from: verify names what changed, the first layer whose
parameters differ, by default (bundle mode, no --localize), even where every runtime passes within tolerance."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import foreign_policies as fp
import mindspore as ms
import numpy as np
import pytest
import shaped_policies as sp
from cli_inprocess import run_module
from mindspore import Tensor

from msrl_consistency.api import export_policy

HERE = Path(__file__).resolve().parent
CASES = {  # factory, contract, the Parameter nudged, its layer, observation source
    "LSTM": ("shaped_policies:make_lstm", sp.LSTM_CONTRACT, "lstm.weight_hh", "lstm", []),
    "Dict robot policy": ("foreign_policies:make_dict_policy", fp.DICT_CONTRACT, "conv.weight", "conv",
                          ["--env", "foreign_envs:make_dict"]),
    "CNN on frames": ("foreign_policies:make_frame_cnn", fp.FRAME_CONTRACT, "conv2.weight", "conv2",
                      ["--observations-file", "frames.npy"]),
}  # fmt: skip


def build(factory: str):  # noqa: ANN201
    module, name = factory.split(":")
    return getattr({"shaped_policies": sp, "foreign_policies": fp}[module], name)()


@pytest.mark.parametrize("case", list(CASES))
def test_a_nudged_checkpoint_names_its_layer_in_bundle_mode(case, tmp_path):
    factory, contract, param, layer, source = CASES[case]
    for module in ("foreign_policies.py", "shaped_policies.py", "foreign_envs.py"):
        shutil.copy(HERE / module, tmp_path)
    np.save(tmp_path / "frames.npy", np.random.default_rng(0).integers(0, 256, (64, 8, 8, 3)).astype(np.float32))
    ms.save_checkpoint(build(factory), str(tmp_path / "genuine.ckpt"))
    export_policy(build(factory), contract, tmp_path / "bundle", checkpoint=tmp_path / "genuine.ckpt")
    cell = build(factory)
    weight = dict(cell.parameters_and_names())[param]
    value = weight.asnumpy().copy()
    value.flat[0] *= 1.02  # one element, 2%
    weight.set_data(Tensor(value))
    ms.save_checkpoint(cell, str(tmp_path / "nudged.ckpt"))
    out = tmp_path / "report"
    proc = run_module("msrl_consistency.verify", "--bundle", "bundle", "--cell", factory, "--ckpt", "nudged.ckpt",
                      "--runtimes", "onnxruntime", "--observations", "200", "--episodes", "1", *source, "--out",
                      str(out), cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    provenance = next(c for c in report["checks"] if c["name"] == "provenance")
    assert provenance["status"] == "fail" and f"first differing layer: {layer} (" in provenance["summary"], provenance
    assert provenance["metrics"]["first_differing_layer"] == layer
    assert report["localization"]["checkpoint"]["first_diverging_layer"] == layer
    assert f"checkpoint: first diverging layer: {layer} (" in proc.stdout, proc.stdout[-3000:]
