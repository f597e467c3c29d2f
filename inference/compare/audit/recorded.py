"""The device as a runtime: a chunk's recorded inputs as verify's feeds, and what the device answered on them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from inference.bundle import Bundle
from inference.bundle.contract import state_dtype
from inference.bundle.recording import Chunk
from inference.compare.feeds import Feeds, finite_rows
from inference.runtimes.base import InferenceFailed, Runtime, RuntimeSource

FIELD = "field"


def chunk_feeds(bundle: Bundle, graph: str, chunk: Chunk) -> Feeds:
    """A chunk's graph inputs as verify's feeds: observation rows (labelled ``recorded``; a row with NaN ``nan``, with
    ±inf ``edge``: judged on its own magnitude), the noise fed or drawn on the host, the carried states."""
    contract = bundle.contract(graph)
    n, k = len(chunk), len(contract.observations)
    if contract.obs_dict:
        obs = contract.empty_observations(n)
        for f, x in zip(contract.observations, chunk.inputs[:k], strict=True):
            obs[f.name] = x
    else:
        obs = chunk.inputs[0]
    noise = {}
    if contract.takes_noise:
        noise[graph] = chunk.inputs[k]
    elif chunk.host_noise is not None and np.isfinite(chunk.host_noise).all():
        noise[graph] = chunk.host_noise
    k += int(contract.takes_noise)
    state = None
    if contract.states:
        state = np.zeros(n, state_dtype(contract.states))
        for s, x in zip(contract.states, chunk.inputs[k:], strict=True):
            state[s.name] = x
    source = np.full(n, "recorded", dtype=object)
    inf = np.zeros(n, bool)
    for x in chunk.inputs[: len(contract.observations)]:
        if x.dtype.kind == "f":
            inf |= np.isinf(x.reshape(n, -1)).any(1)
    source[inf] = "edge"
    source[~finite_rows(obs)] = "nan"
    return Feeds(obs, source.astype(str), noise, state)


class RecordedRuntime(Runtime):
    """The device, as recorded: asked for a chunk's inputs (or their first rows), it answers what it answered."""

    name = FIELD
    description = "the outputs a deployed runtime recorded (inference.field)"

    def __init__(self, source: RuntimeSource, graph: str, chunk: Chunk, batched: Mapping[str, bool]) -> None:
        super().__init__(source, graph)
        self.chunk, self.batched = chunk, batched
        self._index: dict[bytes, list[int]] | None = None  # a row's input bytes -> the recorded rows that have them

    def _load(self) -> None:
        return None

    def _run(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        rows = self._recorded_rows(arrays)
        out = self.chunk.outputs
        return [out[o.name][rows] if self.batched.get(o.name, True) else out[o.name][0] for o in self.outputs]

    def _recorded_rows(self, arrays: list[np.ndarray]) -> np.ndarray:
        """The recorded row of every requested row: verify asks in chunks of any size (its last one filled up with
        copies of its own rows), always with rows the device saw; equal rows are taken in recorded order."""
        if len(arrays) != len(self.chunk.inputs):
            raise InferenceFailed(f"{FIELD}: {len(arrays)} inputs asked, {len(self.chunk.inputs)} recorded")
        if self._index is None:
            self._index = {}
            for i, key in enumerate(_row_keys(self.chunk.inputs)):
                self._index.setdefault(key, []).append(i)
        rows, last = [], -1
        for j, key in enumerate(_row_keys(arrays)):
            seen = self._index.get(key)
            if seen is None:
                raise InferenceFailed(f"{FIELD}: row {j} of the request is not one the device recorded (only those "
                                      "rows answer)")  # fmt: skip
            last = next((i for i in seen if i > last), seen[0])
            rows.append(last)
        return np.asarray(rows, dtype=np.int64)

    def versions(self) -> dict[str, Any]:
        return {"recorded_by": self.chunk.info.meta["runtime"], "chunk": self.chunk.info.path.name}


def _row_keys(arrays: Sequence[np.ndarray]) -> list[bytes]:
    """Each row's bytes over every input (NaN rows match by their bits)."""
    n = len(arrays[0])
    if n == 0:
        return []
    flat = [np.ascontiguousarray(x).reshape(n, -1).view(np.uint8).reshape(n, -1) for x in arrays]
    return [b"".join(x[i].tobytes() for x in flat) for i in range(n)]
