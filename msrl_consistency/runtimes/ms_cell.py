"""``ms-cell`` (the training path, PyNative) and ``ms-graph`` (the same Cell compiled in GRAPH_MODE).

Both run the policy Cell the caller provides (``RuntimeSource.cells``: rebuilt from a checkpoint with a
strict load, or the user's own Cell object), so they are the reference every exported graph is compared with.
"""

from __future__ import annotations

import numpy as np

from inference.runtimes.base import Runtime, RuntimeSource

# MindSpore is imported lazily so that runtimes that do not need it (lite, onnxruntime) work on a deploy box.


def mindspore_device_problem(device: str) -> str | None:
    """Why MindSpore cannot run on ``device`` here, or None."""
    import mindspore as ms

    from msrl_consistency.compat import DEVICES

    target = DEVICES.get(device.lower())
    if target is None:
        return f"unknown device {device!r}"
    return None if ms.hal.is_available(target) else f"MindSpore has no {target} backend on this machine"


class MsCellRuntime(Runtime):
    name = "ms-cell"
    description = "MindSpore Cell rebuilt from the checkpoint, PyNative (the training path)"
    graph_mode = False

    @classmethod
    def unavailable_reason(cls, source: RuntimeSource) -> str | None:
        device = mindspore_device_problem(source.device)
        if device:
            return device
        if source.cells is None:
            return "needs the policy Cell (--ckpt for a run of ours; --cell and --ckpt for your own Cell)"
        return None

    def _load(self) -> None:
        from msrl_consistency import compat

        compat.set_device(self.source.device, self.source.device_id)
        assert self.source.cells is not None
        self.cell = compat.CompiledCall(self.source.cells(self.graph))  # a plain Cell call in PyNative

    def _run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        from mindspore import Tensor

        from msrl_consistency import compat

        with compat.execution_mode(graph=self.graph_mode):
            outs = self.cell(*[Tensor(a) for a in arrays])
        return [o.asnumpy() for o in compat.as_tuple(outs)]

    def _unload(self) -> None:
        """Drop the Cell and its compiled graphs: MindSpore returns their buffers to its pool for the next runtime
        (a CNN's graph holds hundreds of MB per batch size it ran)."""
        import gc

        self.cell = None
        gc.collect()

    def versions(self) -> dict[str, str]:
        from msrl_consistency import compat

        return {"mindspore": compat.mindspore_version()}


class MsGraphRuntime(MsCellRuntime):
    name = "ms-graph"
    description = "the same Cell compiled in GRAPH_MODE"
    graph_mode = True
