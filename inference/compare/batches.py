"""The batches the feeds run in. The reference and every runtime infer the same chunks of the same rows: a row's
outputs never differ by the batch it ran in (kernels block a GEMM by batch size, a few ULP apart), and no side holds
more than one chunk's activations (10k Atari frames are 282 MB of uint8, and 1.1 GB as the float32 a graph's first
cast makes of them; its convolutions' outputs are several times that).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from inference.bundle import Bundle
from inference.compare.feeds import Feeds, row_chunks
from inference.runtimes.base import Runtime

CHUNK_BYTES = 2 << 20  # graph inputs per call at most: an Atari CNN's 74 frames at a time
# Rows per call at most, and the size every call is filled up to: the largest batch of the batch-invariance check
# (``batch_invariance.SIZES``), so a graph compiled for that check serves the feeds too. A compiled graph (MindSpore's,
# one per input shape) then never sees the feeds' own count: a verify of 400 observations compiled each graph of
# each MindSpore runtime once more for 402 rows (~0.1 s each).
CHUNK_ROWS = 256


def chunk_rows(row_bytes: int, n: int) -> list[slice]:
    """Consecutive slices of ``range(n)`` of at most ``CHUNK_ROWS`` rows and ``CHUNK_BYTES`` of inputs each (one
    empty slice for no rows)."""
    budget = min(CHUNK_BYTES, CHUNK_ROWS * max(1, row_bytes))
    return row_chunks(n, row_bytes, budget=budget) or [slice(0, 0)]


def chunk_size(row_bytes: int) -> int:
    """The batch every chunk runs at: ``CHUNK_ROWS``, or fewer where that many rows exceed ``CHUNK_BYTES``."""
    return max(1, min(CHUNK_ROWS, CHUNK_BYTES // max(1, row_bytes)))


def input_row_bytes(bundle: Bundle, graph: str) -> int:
    """Bytes of one row of ``graph``'s inputs (observations, noise, states), from the contract's shapes."""
    return sum(int(np.prod([d for d in m.shape[1:]], dtype=np.int64)) * np.dtype(m.dtype).itemsize
               for m in bundle.contract(graph).input_metas())  # fmt: skip


def infer_rows(
    runtime: Runtime, n: int, row_bytes: int, inputs: Callable[[np.ndarray], Sequence[np.ndarray]]
) -> dict[str, np.ndarray]:
    """``runtime`` on ``n`` rows, a chunk at a time (``inputs(rows)`` builds the graph inputs of those rows), the
    outputs joined. Every chunk is filled up to ``chunk_size`` rows with copies of its own rows (their outputs
    dropped): a compiled graph then sees one batch size whatever ``n`` is, and holds one set of buffers. An output
    that does not follow its chunk's batch (a state-independent std) is the first chunk's."""
    chunks, size = chunk_rows(row_bytes, n), chunk_size(row_bytes)
    parts, sizes = [], []
    for at in chunks:
        rows = np.arange(at.start, at.stop)
        padded = np.resize(rows, size) if 0 < len(rows) < size else rows
        out = runtime.infer(*inputs(padded))
        parts.append({k: v[: len(rows)] if np.ndim(v) and np.shape(v)[0] == len(padded) else v for k, v in out.items()})
        sizes.append(len(rows))
    return join(parts, sizes)


def join(parts: Sequence[Mapping[str, np.ndarray]], sizes: Sequence[int]) -> dict[str, np.ndarray]:
    """Chunk outputs as one: concatenated where every chunk's follows its batch, else the first chunk's."""
    if len(parts) == 1:
        return dict(parts[0])
    out = {}
    for name, first in parts[0].items():
        follows = all(np.ndim(p[name]) and np.shape(p[name])[0] == k for p, k in zip(parts, sizes, strict=True))
        out[name] = np.concatenate([p[name] for p in parts]) if follows else first
    return out


def infer_feeds(runtime: Runtime, bundle: Bundle, graph: str, feeds: Feeds) -> dict[str, np.ndarray]:
    """``graph``'s outputs on every feed row, in the chunks every side uses."""
    return infer_rows(runtime, len(feeds), input_row_bytes(bundle, graph),
                      lambda rows: feeds.graph_inputs(bundle, graph, rows))  # fmt: skip
