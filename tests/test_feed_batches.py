"""The batches verify's feeds run in: every side sees the same few batch sizes, so a compiled graph is reused."""

from __future__ import annotations

import numpy as np
import pytest

from inference.compare.batches import CHUNK_BYTES, CHUNK_ROWS, SMALL_FEEDS, infer_rows
from inference.compare.judge import batch_invariance
from inference.compare.reference_cells import TWIN_PROBE


class Recorder:
    """A runtime that doubles its input row by row and records the batch of every call."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def infer(self, x: np.ndarray) -> dict[str, np.ndarray]:
        self.batches.append(len(x))
        return {"y": x * 2, "std": np.ones(3)}  # std: an output that does not follow the batch


@pytest.mark.parametrize(("n", "row_bytes", "batches"), [
    (402, 24, [256, 256]),  # a 400-observation verify's feeds: the size its other checks compile
    (100, 24, [256]),  # a few rows: filled up to that size too
    (SMALL_FEEDS + 1, 24, [SMALL_FEEDS + 1]),  # many rows of a small policy: one call (the reference runs op by op)
    (10_020, 24, [10_020]),
    (100, 28_224, [74, 74]),  # Atari frames: as many as CHUNK_BYTES holds, the last call filled up
    (0, 24, [0]),
])  # fmt: skip
def test_feeds_run_in_the_sizes_the_other_checks_compile(n, row_bytes, batches):
    assert max(batch_invariance.SIZES) == TWIN_PROBE == CHUNK_ROWS and CHUNK_BYTES // 28_224 == 74
    rt = Recorder()
    rows = np.arange(n, dtype=np.float64)
    out = infer_rows(rt, n, row_bytes, lambda at: [rows[at]])
    assert rt.batches == batches
    np.testing.assert_array_equal(out["y"], rows * 2)  # every row once, in order, the fill-up dropped
    assert out["std"].shape == (3,)
