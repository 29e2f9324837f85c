"""The broker's book-keeping: live workers, chunks in flight and chunks waiting.

Pure data structures with no sockets, so the dispatch policy can be read (and tested) on its own.
Policy: a chunk goes to the live worker that supports its task and has the fewest outstanding tokens,
provided the chunk fits under that worker's advertised capacity (an idle worker takes any chunk);
otherwise it waits, first in first out, in a bounded queue.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from quiver.common.protocol import Chunk


@dataclass
class PendingChunk:
    """A chunk the broker owns until its result or error goes back to the frontend that sent it."""

    message: Chunk
    frontend: bytes
    deadline: float
    attempt: int = 0
    worker: bytes | None = None

    @property
    def chunk_id(self) -> str:
        return self.message.chunk_id

    @property
    def task(self) -> str:
        return self.message.task

    @property
    def num_tokens(self) -> int:
        return self.message.num_tokens


@dataclass
class WorkerState:
    identity: bytes
    name: str
    device: str
    capacity_tokens: int
    max_seqs: int
    tasks: frozenset[str]
    expiry: float
    outstanding_tokens: int = 0
    served_chunks: int = 0
    draining: bool = False
    inflight: dict[str, PendingChunk] = field(default_factory=dict)

    def fits(self, chunk: PendingChunk) -> bool:
        if self.draining or chunk.task not in self.tasks:
            return False
        return not self.inflight or self.outstanding_tokens + chunk.num_tokens <= self.capacity_tokens


class QueueFull(Exception):
    """The bounded queue of waiting chunks is full."""


class Dispatcher:
    def __init__(self, max_queued: int) -> None:
        self.workers: dict[bytes, WorkerState] = {}
        self.queue: collections.deque[PendingChunk] = collections.deque()
        self.queued_ids: set[str] = set()
        self.inflight: dict[str, PendingChunk] = {}
        self.max_queued = max_queued

    # workers ---------------------------------------------------------------------------------
    def add_worker(self, worker: WorkerState) -> list[PendingChunk]:
        """Register a worker; if its identity was already known, return the chunks it held."""
        orphans = self.remove_worker(worker.identity)
        self.workers[worker.identity] = worker
        return orphans

    def remove_worker(self, identity: bytes) -> list[PendingChunk]:
        """Forget a worker and return the chunks it held, unassigned, for the caller to requeue."""
        worker = self.workers.pop(identity, None)
        if worker is None:
            return []
        orphans = list(worker.inflight.values())
        for chunk in orphans:
            chunk.worker = None
            self.inflight.pop(chunk.chunk_id, None)
        return orphans

    def expired_workers(self, now: float) -> list[WorkerState]:
        return [w for w in self.workers.values() if w.expiry < now]

    def supports(self, task: str) -> bool:
        return any(task in w.tasks for w in self.workers.values())

    # chunks ----------------------------------------------------------------------------------
    def pick_worker(self, chunk: PendingChunk) -> WorkerState | None:
        candidates = [w for w in self.workers.values() if w.fits(chunk)]
        return min(candidates, key=lambda w: w.outstanding_tokens, default=None)

    def assign(self, chunk: PendingChunk, worker: WorkerState) -> None:
        chunk.worker = worker.identity
        worker.inflight[chunk.chunk_id] = chunk
        worker.outstanding_tokens += chunk.num_tokens
        self.inflight[chunk.chunk_id] = chunk

    def enqueue(self, chunk: PendingChunk, front: bool = False) -> None:
        """Hold a chunk until a worker has room; a requeued chunk goes to the front."""
        if not front and len(self.queue) >= self.max_queued:
            raise QueueFull
        if front:
            self.queue.appendleft(chunk)
        else:
            self.queue.append(chunk)
        self.queued_ids.add(chunk.chunk_id)

    def pop_queued(self) -> PendingChunk:
        chunk = self.queue.popleft()
        self.queued_ids.discard(chunk.chunk_id)
        return chunk

    def knows(self, chunk_id: str) -> bool:
        """Whether the chunk is queued or in flight (so a second copy of it is a duplicate)."""
        return chunk_id in self.inflight or chunk_id in self.queued_ids

    def complete(self, chunk_id: str, served: bool = True) -> PendingChunk | None:
        """The chunk's outcome arrived: release it. None when it is unknown (a duplicate)."""
        chunk = self.inflight.pop(chunk_id, None)
        if chunk is None:
            return None
        worker = self.workers.get(chunk.worker) if chunk.worker is not None else None
        if worker is not None and worker.inflight.pop(chunk_id, None) is not None:
            worker.outstanding_tokens -= chunk.num_tokens
            worker.served_chunks += int(served)
        return chunk

    def cancel(self, chunk_id: str) -> PendingChunk | None:
        """Drop a chunk: from the queue (returns it, worker None) or from a worker (returns it)."""
        if chunk_id in self.queued_ids:
            for chunk in self.queue:
                if chunk.chunk_id == chunk_id:
                    self.queue.remove(chunk)
                    self.queued_ids.discard(chunk_id)
                    return chunk
        return self.complete(chunk_id, served=False)

    def take_expired_queued(self, now: float) -> list[PendingChunk]:
        expired = [c for c in self.queue if c.deadline < now]
        for chunk in expired:
            self.queue.remove(chunk)
            self.queued_ids.discard(chunk.chunk_id)
        return expired
