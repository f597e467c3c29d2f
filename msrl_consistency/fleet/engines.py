"""Where a fleet's chunks are judged and folded: in this process (``local``) or on Ray workers (``ray``).

Each device's recording is audited as ``--audit`` audits it (``RecordingAudit``): every chunk judged (the training
path rerun on its recorded inputs, then verify's comparison: ``task(...).judge``, nearly all of the time), then
folded into the device's totals in recording order. Both engines run that same code in that same order per device,
so they write the same report.

Ray: one worker per CPU of the cluster (``ray.init`` with this machine's cores, or the cluster at ``--ray-address``),
each an actor that builds the reference Cell once per graph. A chunk travels through Ray's object store (workers on
other machines need the checkpoint at the same path, not the recordings); any worker judges it, and the worker that
judged it folds it into its device's audit, which passes from chunk to chunk as Ray's objects: devices fold in
parallel and a long recording's chunks are judged on every worker. Every task only waits for tasks submitted before
it, so the workers' queues cannot deadlock. At most two chunks per worker are in flight. A worker that dies: its
device's audit restarts from its last folded chunk on the others (and a replacement), up to ``MAX_ATTEMPTS`` times;
every retry is reported.
"""

from __future__ import annotations

import copy
import logging
import os
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inference.bundle.recording import Chunk, read_chunk
from inference.compare.audit import ChunkTask, RecordingAudit
from inference.compare.runtime_check import RuntimeReport
from inference.errors import INTERRUPTS, RuntimeUnavailable, UsageError, first_line
from inference.runtimes.base import RuntimeSource
from msrl_consistency.audit import reference_outputs

MAX_ATTEMPTS = 3  # times a chunk is sent to a worker before its device is reported as not audited
IN_FLIGHT_PER_WORKER = 2  # one judged while the next one travels
WAIT_S = 0.5  # how often a wait for a worker looks for Ctrl-C


@dataclass
class Audited:
    """A device's audit with every chunk folded (``run``), or why it could not be (``error``)."""

    device: str
    run: RecordingAudit | None
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
    """Every chunk judged and folded in this process, device after device."""

    name = "local"

    def __init__(self, cells: Any, device: str) -> None:
        self.judge = Judge(cells, device)

    def audit(self, audits: dict[str, RecordingAudit]) -> Iterator[Audited]:
        for name, run in audits.items():
            info = None
            try:
                for info in run.index.chunks:
                    INTERRUPTS.check()
                    chunk = read_chunk(info, run.index.layout)
                    run.fold(info, chunk, *self.judge(run.task(info), chunk))
            except (KeyboardInterrupt, MemoryError):
                raise
            except Exception as exc:  # noqa: BLE001 - one device's fault is reported, the rest still audited
                yield Audited(name, None, f"{info.path.name if info is not None else name}: {first_line(exc)}")
                continue
            yield Audited(name, run)

    def facts(self) -> dict[str, Any]:
        return {"engine": self.name, "workers": 1, "retries": []}

    def close(self) -> None:
        self.judge.close()


class JudgeWorker:
    """A Ray actor: a ``Judge`` built once; it judges chunks and folds the ones it judged into their device's audit."""

    def __init__(self, cells: Any, device: str) -> None:
        self.judge = Judge(cells, device)

    def run(self, task: ChunkTask, chunk: Chunk) -> tuple[dict[str, np.ndarray], RuntimeReport]:
        return self.judge(task, chunk)

    def fold(self, audit: RecordingAudit, info: Any, chunk: Chunk, judged: tuple) -> RecordingAudit:
        audit = copy.deepcopy(audit)  # Ray hands over its objects' arrays read-only; the fold adds to them in place
        audit.fold(info, chunk, *judged)
        return audit

    def pid(self) -> int:
        return os.getpid()

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


@dataclass
class _Device:
    """A device in flight on Ray: its audit before its first chunk, and each chunk's references once sent."""

    name: str
    start: Any  # ObjectRef of its RecordingAudit before any chunk
    infos: list[Any]
    chunks: list[Any] = field(default_factory=list)  # ObjectRefs of the chunks sent so far
    states: list[Any] = field(default_factory=list)  # ObjectRef of the audit after each chunk sent
    workers: list[Any] = field(default_factory=list)  # the actor that judged and folded each chunk
    attempts: int = 1


class RayEngine:
    """Chunks judged and folded by Ray actors, one per CPU of the cluster."""

    name = "ray"

    def __init__(self, cells: Any, device: str, address: str | None = None) -> None:
        try:
            import ray
        except ImportError:
            raise RuntimeUnavailable("--engine ray needs Ray: pip install 'ray>=2.54'") from None
        self.ray, self.cells, self.device, self.address = ray, cells, device, address
        self.retries: list[dict[str, Any]] = []
        self.started = not ray.is_initialized()
        if self.started:
            try:
                # "local": a new instance of our own, never a cluster another job started on this machine (what
                # ray.init() without an address would join)
                ray.init(address=address or "local", num_cpus=None if address else os.cpu_count(),
                         include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)  # fmt: skip
            except (ConnectionError, ValueError, RuntimeError) as exc:
                raise UsageError(f"--ray-address {address}: {first_line(exc)}") from None
        cpus = int(ray.cluster_resources().get("CPU", 0))
        if cpus < 1:
            raise RuntimeUnavailable("the Ray cluster has no CPU to run a worker on")
        self.actor_class = ray.remote(num_cpus=1, max_restarts=0)(JudgeWorker)
        self.workers = [self.actor_class.remote(cells, device) for _ in range(cpus)]
        self._next = 0

    def pids(self) -> list[int]:
        """The worker processes' ids (what a test kills)."""
        return self.ray.get([w.pid.remote() for w in self.workers])

    def audit(self, audits: dict[str, RecordingAudit]) -> Iterator[Audited]:
        """Send every device's chunks in order, waiting on the oldest once ``IN_FLIGHT_PER_WORKER`` per worker are
        out; yield each device as its last chunk is folded."""
        sent: deque[tuple[_Device, int]] = deque()  # (device, chunk) in the order sent
        for name, run in audits.items():
            device = _Device(name, self.ray.put(run), list(run.index.chunks))
            if not device.infos:
                yield Audited(name, run)
            for k, info in enumerate(device.infos):
                try:
                    chunk = read_chunk(info, run.index.layout)
                except Exception as exc:  # noqa: BLE001 - a chunk that cannot be read: that device's verdict
                    yield Audited(name, None, f"{info.path.name}: {first_line(exc)}")
                    sent = deque(s for s in sent if s[0] is not device)
                    break
                device.chunks.append(self.ray.put(chunk))
                self._send(device, k, run.task(info))
                sent.append((device, k))
                while len(sent) >= IN_FLIGHT_PER_WORKER * len(self.workers):
                    yield from self._settle(sent.popleft(), audits)
        while sent:
            yield from self._settle(sent.popleft(), audits)

    def _send(self, device: _Device, k: int, task: ChunkTask) -> None:
        worker = self.workers[self._next % len(self.workers)]
        self._next += 1
        previous = device.states[k - 1] if k else device.start
        judged = worker.run.remote(task, device.chunks[k])
        state = worker.fold.remote(previous, device.infos[k], device.chunks[k], judged)
        if k < len(device.states):
            device.states[k], device.workers[k] = state, worker
        else:
            device.states.append(state)
            device.workers.append(worker)

    def _settle(self, item: tuple[_Device, int], audits: dict[str, RecordingAudit]) -> Iterator[Audited]:
        """Wait for a sent chunk's fold (looking for Ctrl-C); at a device's last chunk, its audit or its error."""
        device, k = item
        self._wait(device.states[k])
        if k < len(device.infos) - 1:
            return
        while True:
            try:
                yield Audited(device.name, self.ray.get(device.states[k]))
                return
            except self.ray.exceptions.RayActorError as exc:
                if not self._retry(device, audits[device.name], exc):
                    why = first_line(exc, 200)
                    yield Audited(device.name, None, f"its workers died {device.attempts} times ({why})")
                    return
                self._wait(device.states[k])
            except self.ray.exceptions.RayTaskError as exc:
                yield Audited(device.name, None, first_line(exc.cause if exc.cause is not None else exc))
                return

    def _wait(self, ref: Any) -> None:
        while not self.ray.wait([ref], timeout=WAIT_S)[0]:
            INTERRUPTS.check()

    def _retry(self, device: _Device, run: RecordingAudit, exc: Exception) -> bool:
        """A worker died under ``device`` (``exc`` names it): a new worker in its place, and the device's chunks sent
        again from the last one folded (False once it has been tried ``MAX_ATTEMPTS`` times)."""
        first = next((k for k, state in enumerate(device.states) if not self._folded(state)), 0)
        why = first_line(exc, 200)
        self._replace(getattr(exc, "actor_id", None))
        self.retries.append({"device": device.name, "from_chunk": device.infos[first].path.name,
                             "chunks": len(device.states) - first, "attempt": device.attempts, "why": why})  # fmt: skip
        if device.attempts >= MAX_ATTEMPTS:
            return False
        device.attempts += 1
        for k in range(first, len(device.states)):
            self._send(device, k, run.task(device.infos[k]))
        return True

    def _folded(self, state: Any) -> bool:
        try:
            self.ray.get(state)
            return True
        except self.ray.exceptions.RayError:
            return False

    def _replace(self, dead: str | None) -> None:
        """A new worker in place of the dead one (by its actor id; once, however many chunks it took with it)."""
        for k, worker in enumerate(self.workers):
            if worker._actor_id.hex() == dead:
                self.ray.kill(worker, no_restart=True)
                self.workers[k] = self.actor_class.remote(self.cells, self.device)

    def facts(self) -> dict[str, Any]:
        return {"engine": self.name, "workers": len(self.workers), "retries": list(self.retries)}

    def close(self) -> None:
        for worker in self.workers:
            self.ray.kill(worker, no_restart=True)
        if self.started:
            self.ray.shutdown()
