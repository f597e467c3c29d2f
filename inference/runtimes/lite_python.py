"""``lite-python``: the ``mindspore_lite`` Python API in a worker process.

For machines with a Lite matching the exporter (2.3+). Lite and MindSpore 2.10 cannot share a
process, so the API runs in a child interpreter (``$MSRL_LITE_PYTHON``, default this interpreter)
that serves ``.npz`` requests over a pipe. The PyPI wheel (2.0.0, cp37 only) cannot load here, so on
this machine the runtime reports itself unavailable with that reason.
"""

from __future__ import annotations

import io
import os
import struct
import subprocess
import sys

import numpy as np

from inference.runtimes.base import InferenceFailed, Runtime, RuntimeSource

WORKER = r"""
import io, struct, sys
import numpy as np
import mindspore_lite as mslite
ctx = mslite.Context(); ctx.target = ["cpu"]
model = mslite.Model(); model.build_from_file(sys.argv[1], mslite.ModelType.MINDIR, ctx)
sys.stdout.buffer.write(b"ready\n"); sys.stdout.buffer.flush()
while True:
    head = sys.stdin.buffer.read(8)
    if len(head) < 8:
        break
    req = np.load(io.BytesIO(sys.stdin.buffer.read(struct.unpack("<Q", head)[0])))
    inputs = model.get_inputs()
    arrays = [req[f"arr_{i}"] for i in range(len(inputs))]
    model.resize(inputs, [list(a.shape) for a in arrays])
    for t, a in zip(inputs, arrays):
        t.set_data_from_numpy(a)
    outs = [o.get_data_to_numpy() for o in model.predict(inputs)]
    buf = io.BytesIO(); np.savez(buf, *outs); data = buf.getvalue()
    sys.stdout.buffer.write(struct.pack("<Q", len(data)) + data); sys.stdout.buffer.flush()
"""


def _python() -> str:
    return os.environ.get("MSRL_LITE_PYTHON", sys.executable)


class LitePythonRuntime(Runtime):
    name = "lite-python"
    description = "mindspore_lite Python API (Model.build_from_file) in a worker process"
    fmt = "mindir"

    @classmethod
    def unavailable_reason(cls, source: RuntimeSource) -> str | None:
        try:
            proc = subprocess.run(
                [_python(), "-c", "import mindspore_lite; print(mindspore_lite.__version__)"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"cannot start {_python()}: {exc}"
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["import failed"])[-1]
            return f"mindspore_lite does not import in {_python()} ({last}); set MSRL_LITE_PYTHON to one that has it"
        return None

    def _load(self) -> None:
        path = self.model_path()
        self.proc = subprocess.Popen(
            [_python(), "-c", WORKER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        if self.proc.stdout.readline() != b"ready\n":  # type: ignore[union-attr]
            err = self.proc.stderr.read().decode(errors="replace").strip().splitlines()[-1:]  # type: ignore[union-attr]
            self.proc.kill()
            raise InferenceFailed(f"{self.name}: worker failed to load {path.name}: {err}")

    def _run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        buf = io.BytesIO()
        np.savez(buf, *arrays)
        data = buf.getvalue()
        self.proc.stdin.write(struct.pack("<Q", len(data)) + data)  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        head = self.proc.stdout.read(8)  # type: ignore[union-attr]
        if len(head) < 8:
            raise InferenceFailed(f"{self.name}: worker exited")
        reply = np.load(io.BytesIO(self.proc.stdout.read(struct.unpack("<Q", head)[0])))  # type: ignore[union-attr]
        return [reply[f"arr_{i}"] for i in range(len(reply.files))]

    def _unload(self) -> None:
        self.proc.kill()
        self.proc.wait()
