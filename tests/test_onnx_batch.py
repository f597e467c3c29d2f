"""The ONNX export's symbolic batch: two exports where nothing depends on the batch, a third where something does."""

from __future__ import annotations

import foreign_policies as fp
import mindspore as ms
import numpy as np
import onnxruntime as ort
import pytest
from mindspore import nn

from msrl_consistency import compat
from msrl_consistency.api import export_policy
from msrl_consistency.artifacts import graphs
from msrl_consistency.artifacts.bundle import ExportOptions

MLP_CONTRACT = {"env_id": "CartPole-v1", "input": {"obs": [4]}, "outputs": {"names": ["logits"]},
                "action": {"kind": "categorical", "logits": "logits"}}  # fmt: skip


def make_mlp() -> nn.Cell:
    ms.set_seed(2)
    return nn.SequentialCell(nn.Dense(4, 16), nn.Tanh(), nn.Dense(16, 2))


@pytest.mark.parametrize(
    ("make", "contract", "batches"),
    [(make_mlp, MLP_CONTRACT, [2, 5]), (fp.make_old_style, fp.OLD_STYLE_CONTRACT, [2, 5, 3])],
    ids=["nothing depends on the batch", "zeros_like and a reshape frozen at the batch"],
)
def test_a_third_export_only_where_the_first_two_differ(make, contract, batches, tmp_path, monkeypatch):
    exported = []
    export = graphs.ms.export

    def counted(cell, *inputs, **kwargs):
        if kwargs.get("file_format") == "ONNX":
            exported.append(inputs[0].shape[0])
        return export(cell, *inputs, **kwargs)

    monkeypatch.setattr(graphs.ms, "export", counted)
    bundle = export_policy(make(), contract, tmp_path / "b", options=ExportOptions(formats=("onnx",)))
    assert exported == batches  # and the bundle's self-check ran the result at 256 rows
    obs = np.random.default_rng(0).standard_normal((7, contract["input"]["obs"][0])).astype(np.float32)
    session = ort.InferenceSession(str(bundle.file("policy", "onnx")), providers=["CPUExecutionProvider"])
    got = session.run(None, {"obs": obs})
    want = [o.asnumpy() for o in compat.as_tuple(make()(ms.Tensor(obs)))]
    assert [g.shape for g in got] == [w.shape for w in want]  # at a batch none of the exports had
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
