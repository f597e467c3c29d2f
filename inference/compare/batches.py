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

CHUNK_BYTES = 2 << 20  # graph inputs per call: a small policy's 10k rows in one call, an Atari CNN's 74 at a time
# A few feeds (at most SMALL_FEEDS rows) run in calls of CHUNK_ROWS rows instead: the largest batch of the
# batch-invariance check (``batch_invariance.SIZES``) and of the compiled twin's probe, so the graphs compiled for those
# serve the feeds too (a MindSpore graph compiles once per input shape, ~0.1 s; a verify of 400 observations compiled
# each graph of each MindSpore runtime once more for its 402 rows). More rows stay in CHUNK_BYTES calls: the reference
# Cell runs op by op, 20-40 ms a call whatever its rows, so 10k rows in 256-row calls would cost it seconds.
CHUNK_ROWS = 256
SMALL_FEEDS = 4 * CHUNK_ROWS


def chunk_size(row_bytes: int, n: int) -> int:
    """Rows per call for ``n`` rows of ``row_bytes``: ``CHUNK_ROWS`` for a few rows, else as many as ``CHUNK_BYTES``
    holds; never more than ``CHUNK_BYTES`` holds (one row at least)."""
    fit = max(1, CHUNK_BYTES // max(1, row_bytes))
    return min(CHUNK_ROWS if n <= SMALL_FEEDS else max(n, 1), fit)


def input_row_bytes(bundle: Bundle, graph: str) -> int:
    """Bytes of one row of ``graph``'s inputs (observations, noise, states), from the contract's shapes."""
    return sum(int(np.prod([d for d in m.shape[1:]], dtype=np.int64)) * np.dtype(m.dtype).itemsize
               for m in bundle.contract(graph).input_metas())  # fmt: skip


def infer_rows(
    runtime: Runtime, n: int, row_bytes: int, inputs: Callable[[np.ndarray], Sequence[np.ndarray]]
) -> dict[str, np.ndarray]:
    """``runtime`` on ``n`` rows, a chunk at a time (``inputs(rows)`` builds the graph inputs of those rows), the
    outputs joined. A chunk shorter than ``chunk_size`` (the last, or a few rows' only one) is filled up to it with
    copies of its own rows (their outputs dropped): a compiled graph then sees one batch size, and holds one set of
    buffers. An output that does not follow its chunk's batch (a state-independent std) is the first chunk's."""
    size = chunk_size(row_bytes, n)
    chunks = row_chunks(n, 1, budget=size) or [slice(0, 0)]  # one call of no rows for none
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
