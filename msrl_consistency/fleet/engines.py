"""Where a fleet's chunks are judged: in this process (``local``) or on Ray workers (``ray``).

Judging a chunk (the training path rerun on its recorded inputs, then verify's comparison of the recorded outputs:
``RecordingAudit.task(...).judge``) is nearly all of an audit's time; folding the judged chunk into its device's
totals is a few percent. So an engine maps chunks, and the caller folds what it yields, in the order the items came:
the merge is the same code and the same order on both engines, and so is the report.

Ray: one worker per CPU of the cluster (``ray.init`` with this machine's cores, or the cluster at ``--ray-address``),
each an actor that builds the reference Cell once per graph and judges one chunk at a time. The chunk travels through
Ray's object store, so workers on other machines need the checkpoint at the same path but not the recordings. At most
two chunks per worker are in flight. A worker that dies has its chunks judged again by the others (and by a
replacement), up to ``MAX_ATTEMPTS`` each; every retry is reported.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from inference.bundle.recording import Chunk, Layout, read_chunk
from inference.compare.audit import ChunkTask
from inference.compare.runtime_check import RuntimeReport
from inference.errors import INTERRUPTS, RuntimeUnavailable, UsageError, first_line
from inference.runtimes.base import RuntimeSource
from msrl_consistency.audit import reference_outputs

MAX_ATTEMPTS = 3  # times a chunk is sent to a worker before its device is reported as not audited
IN_FLIGHT_PER_WORKER = 2  # one judged while the next one travels
WAIT_S = 0.5  # how often a wait for a worker looks for Ctrl-C


@dataclass(frozen=True)
class Item:
    """One chunk of one device's recording, with what judging it needs."""

    device: str
    info: Any  # inference.bundle.recording.ChunkInfo
    layout: Layout
    task: ChunkTask


@dataclass
class Judged:
    """An item judged: the chunk, the reference's outputs on it and verify's report; or why it could not be."""

    item: Item
    chunk: Chunk | None
    want: Mapping[str, np.ndarray] | None = None
    report: RuntimeReport | None = None
    error: str | None = None


class Judge:
    """The training path (``ms-cell``, one per graph, built on first use) and the comparison: what every worker runs."""

    def __init__(self, cells: Any, device: str) -> None:
        import msrl_consistency.runtimes  # noqa: F401 - registers ms-cell
        from inference.runtimes.registry import create

        self.cells, self.device, self._create, self.references = cells, device, create, {}

    def __call__(self, task: ChunkTask, chunk: Chunk) -> tuple[dict[str, np.ndarray], RuntimeReport]:
        reference = self.references.get(task.graph)
        if reference is None:
            source = RuntimeSource(task.view, self.cells, self.device)
            reference = self.references[task.graph] = self._create("ms-cell", source, task.graph).__enter__()
        want = reference_outputs(reference, chunk)
        return want, task.judge(chunk, want, self.cells)

    def close(self) -> None:
        for reference in self.references.values():
            reference.close()
        self.references.clear()


class LocalEngine:
    """Every chunk judged in this process, one after the other."""

    name = "local"

    def __init__(self, cells: Any, device: str) -> None:
        self.judge = Judge(cells, device)

    def run(self, items: Iterable[Item]) -> Iterator[Judged]:
        for item in items:
            INTERRUPTS.check()
            try:
                chunk = read_chunk(item.info, item.layout)
                want, report = self.judge(item.task, chunk)
            except (KeyboardInterrupt, MemoryError):
                raise
            except Exception as exc:  # noqa: BLE001 - one device's fault is reported, the rest still audited
                yield Judged(item, None, error=first_line(exc))
                continue
            yield Judged(item, chunk, want, report)

    def facts(self) -> dict[str, Any]:
        return {"engine": self.name, "workers": 1, "retries": []}

    def close(self) -> None:
        self.judge.close()


class JudgeWorker:
    """A Ray actor: a ``Judge`` built once, judging one chunk per call."""

    def __init__(self, cells: Any, device: str) -> None:
        self.judge = Judge(cells, device)

    def run(self, task: ChunkTask, chunk: Chunk) -> tuple[dict[str, np.ndarray], RuntimeReport]:
        return self.judge(task, chunk)

    def pid(self) -> int:
        return os.getpid()

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


@dataclass
class _Sent:
    judged: Judged
    worker: int = -1
    ref: Any = None
    attempts: int = 0


class RayEngine:
    """Chunks judged by Ray actors, one per CPU of the cluster; results yielded in the order of the items."""

    name = "ray"

    def __init__(self, cells: Any, device: str, address: str | None = None) -> None:
        self.cells, self.device, self.address = cells, device, address
        self.retries: list[dict[str, Any]] = []
        self._pending: deque[_Sent] = deque()
        try:
            import ray
        except ImportError:
            raise RuntimeUnavailable("--engine ray needs Ray: pip install 'ray>=2.54'") from None
        self.ray = ray
        self.started = not ray.is_initialized()
        if self.started:
            try:
                ray.init(address=self.address, num_cpus=None if self.address else os.cpu_count(),
                         include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)  # fmt: skip
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise UsageError(f"--ray-address {self.address}: {first_line(exc)}") from None
        cpus = int(ray.cluster_resources().get("CPU", 0))
        if cpus < 1:
            raise RuntimeUnavailable("the Ray cluster has no CPU to run a worker on")
        self.actor_class = ray.remote(num_cpus=1, max_restarts=0)(JudgeWorker)
        self.workers = [self._start() for _ in range(cpus)]
        self.load = [0] * cpus

    def _start(self) -> Any:
        return self.actor_class.remote(self.cells, self.device)

    def pids(self) -> list[int]:
        """The worker processes' ids (what a test kills)."""
        return self.ray.get([w.pid.remote() for w in self.workers])

    def run(self, items: Iterable[Item]) -> Iterator[Judged]:
        self._pending = pending = deque()
        source = iter(items)
        while True:
            while len(pending) < IN_FLIGHT_PER_WORKER * len(self.workers):
                item = next(source, None)
                if item is None:
                    break
                pending.append(self._send(item))
            if not pending:
                return
            head = pending[0]
            if head.ref is not None and not self._finished(head):
                continue
            pending.popleft()
            yield head.judged

    def _send(self, item: Item) -> _Sent:
        sent = _Sent(Judged(item, None))
        try:
            sent.judged.chunk = read_chunk(item.info, item.layout)
        except Exception as exc:  # noqa: BLE001 - reported as the device's, the rest still audited
            sent.judged.error = first_line(exc)
            return sent
        self._submit(sent)
        return sent

    def _submit(self, sent: _Sent) -> None:
        k = min(range(len(self.workers)), key=self.load.__getitem__)
        sent.worker, sent.attempts = k, sent.attempts + 1
        sent.ref = self.workers[k].run.remote(sent.judged.item.task, sent.judged.chunk)
        self.load[k] += 1

    def _finished(self, sent: _Sent) -> bool:
        """Wait for ``sent`` (looking for Ctrl-C between waits); False when it was sent again (its worker died)."""
        ray = self.ray
        while not ray.wait([sent.ref], timeout=WAIT_S)[0]:
            INTERRUPTS.check()
        try:
            sent.judged.want, sent.judged.report = ray.get(sent.ref)
        except ray.exceptions.RayActorError as exc:
            self._replace(sent.worker, exc)
            return sent.judged.error is not None
        except ray.exceptions.RayTaskError as exc:
            sent.judged.error = first_line(exc.cause if exc.cause is not None else exc)
        self.load[sent.worker] -= 1
        sent.ref = None
        return True

    def _replace(self, k: int, exc: Exception) -> None:
        """Worker ``k`` died: a new worker in its place, and every chunk it held sent again."""
        self.ray.kill(self.workers[k], no_restart=True)
        self.workers[k], self.load[k] = self._start(), 0
        why = first_line(exc, 200)
        for sent in list(self._held_by(k)):
            judged = sent.judged
            self.retries.append({"device": judged.item.device, "chunk": judged.item.info.path.name, "worker": k,
                                 "attempt": sent.attempts, "why": why})  # fmt: skip
            if sent.attempts >= MAX_ATTEMPTS:
                judged.error = f"the workers judging {judged.item.info.path.name} died {sent.attempts} times ({why})"
                sent.ref = None
            else:
                self._submit(sent)

    def _held_by(self, k: int) -> Iterator[_Sent]:
        yield from (s for s in self._pending if s.worker == k and s.ref is not None)

    def facts(self) -> dict[str, Any]:
        return {"engine": self.name, "workers": len(self.workers), "retries": list(self.retries)}

    def close(self) -> None:
        for worker in self.workers:
            self.ray.kill(worker, no_restart=True)
        if self.started:
            self.ray.shutdown()
