"""``ms-mindir``: the exported MindIR loaded back with ``nn.GraphCell(ms.load(...))``."""

from __future__ import annotations

import numpy as np

from inference.runtimes.base import Runtime, RuntimeSource


class MsMindirRuntime(Runtime):
    name = "ms-mindir"
    description = "MindSpore GraphCell on the bundle's .mindir"
    fmt = "mindir"

    @classmethod
    def unavailable_reason(cls, source: RuntimeSource) -> str | None:
        from msrl_consistency.runtimes.ms_cell import mindspore_device_problem

        return mindspore_device_problem(source.device)

    def _load(self) -> None:
        import mindspore as ms

        from msrl_consistency import compat

        compat.set_device(self.source.device, self.source.device_id)
        self.cell = compat.CompiledCall(ms.nn.GraphCell(ms.load(str(self.model_path()))))

    def _run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        from mindspore import Tensor

        from msrl_consistency import compat

        return [o.asnumpy() for o in compat.as_tuple(self.cell(*[Tensor(a) for a in arrays]))]

    def _unload(self) -> None:
        """Drop the Cell and its compiled graphs: MindSpore returns their buffers to its pool for the next runtime
        (a CNN's graph holds hundreds of MB per batch size it ran)."""
        import gc

        self.cell = None
        gc.collect()

    def versions(self) -> dict[str, str]:
        from msrl_consistency import compat

        return {"mindspore": compat.mindspore_version()}
