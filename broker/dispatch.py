"""The broker's book-keeping: live workers, chunks in flight and chunks waiting.

Pure data structures with no sockets (tests/broker/test_dispatch.py drives them directly).
Policy: a chunk goes to the live worker that supports its task and has the fewest outstanding tokens,
provided the chunk fits under that worker's advertised capacity (an idle worker takes any chunk);
otherwise it waits, first in first out, in a bounded queue. A chunk held by one worker past its
hold deadline is taken back (`take_overdue`) so the broker can give it to another.

Priority: background chunks (bulk jobs) wait in a queue of their own, bounded like the online one, and
leave it only when no online chunk waits. A worker holds at most `max_background` background chunks
at once, and their tokens do not count against its capacity for online chunks, so background work
never keeps an online chunk from a worker (the worker's scheduler puts online rows first in a step).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from quiver.common.protocol import PRIORITY_ONLINE, Routed


# Identities a chunk's answer goes to at most: the frontend's sockets that sent it, latest last.
MAX_SENDERS = 4


@dataclass
class PendingChunk:
    """A chunk the broker owns until its result or error goes back to the frontend that sent it.
    `message` is the CHUNK as received (header checked, array frames unread). `frontends` are the
    identities it came from: one, unless its frontend sent it again from a rebuilt socket; the answer
    goes to each (a closed one drops it), since which copy arrived last says nothing of which socket
    is still open."""

    message: Routed
    frontends: list[bytes]
    deadline: float
    attempt: int = 0
    worker: bytes | None = None
    hold_until: float = float("inf")
    # Workers that held the chunk before and lost it (timed out): their late answers are duplicates.
    former_workers: set[bytes] = field(default_factory=set)

    @property
    def chunk_id(self) -> str:
        return self.message.chunk_id

    def add_sender(self, frontend: bytes) -> None:
        if frontend not in self.frontends:
            self.frontends = [*self.frontends, frontend][-MAX_SENDERS:]

    @property
    def task(self) -> str:
        return str(self.message.header["task"])

    @property
    def num_tokens(self) -> int:
        return int(self.message.header["num_tokens"])

    @property
    def num_seqs(self) -> int:
        return int(self.message.header["num_seqs"])

    @property
    def background(self) -> bool:
        return int(self.message.header.get("priority", PRIORITY_ONLINE)) != PRIORITY_ONLINE


@dataclass
class WorkerState:
    identity: bytes
    name: str
    device: str
    capacity_tokens: int
    tasks: frozenset[str]
    expiry: float
    output_dim: int
    output_dtype: str = "float32"
    model: str = ""
    fingerprint: str = ""
    outstanding_tokens: int = 0
    draining: bool = False
    inflight: dict[str, PendingChunk] = field(default_factory=dict)

    def fits(self, chunk: PendingChunk) -> bool:
        """Whether the chunk fits under the capacity; for an online chunk only online tokens count."""
        if self.draining or chunk.task not in self.tasks:
            return False
        if chunk.background:
            return not self.inflight or self.outstanding_tokens + chunk.num_tokens <= self.capacity_tokens
        online = [c.num_tokens for c in self.inflight.values() if not c.background]
        return not online or sum(online) + chunk.num_tokens <= self.capacity_tokens

    @property
    def background_chunks(self) -> int:
        return sum(1 for c in self.inflight.values() if c.background)


class QueueFull(Exception):
    """The bounded queue of waiting chunks is full."""


class Dispatcher:
    def __init__(self, max_queued: int, max_background: int = 4) -> None:
        self.workers: dict[bytes, WorkerState] = {}
        self.queue: collections.deque[PendingChunk] = collections.deque()  # online chunks
        self.background_queue: collections.deque[PendingChunk] = collections.deque()
        self.queued_ids: set[str] = set()
        self.inflight: dict[str, PendingChunk] = {}
        self.max_queued = max_queued
        self.max_background = max_background  # background chunks one worker holds at most

    # workers ---------------------------------------------------------------------------------
    def add_worker(self, worker: WorkerState) -> None:
        """Register a worker. A READY again from a registered identity is the same process (say, after
        duplicate RECONNECTs): it keeps the chunks it holds."""
        known = self.workers.get(worker.identity)
        if known is not None:
            worker.inflight, worker.outstanding_tokens = known.inflight, known.outstanding_tokens
        self.workers[worker.identity] = worker

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

    # chunks ----------------------------------------------------------------------------------
    def pick_worker(self, chunk: PendingChunk) -> WorkerState | None:
        """The fitting worker with the fewest outstanding tokens, one that lost this chunk before last."""
        candidates = [w for w in self.workers.values() if w.fits(chunk)
                      and not (chunk.background and w.background_chunks >= self.max_background)]
        return min(candidates, key=lambda w: (w.identity in chunk.former_workers, w.outstanding_tokens),
                   default=None)

    def assign(self, chunk: PendingChunk, worker: WorkerState, hold_until: float = float("inf")) -> None:
        chunk.worker = worker.identity
        chunk.hold_until = hold_until
        worker.inflight[chunk.chunk_id] = chunk
        worker.outstanding_tokens += chunk.num_tokens
        self.inflight[chunk.chunk_id] = chunk

    def _queue_of(self, chunk: PendingChunk) -> collections.deque[PendingChunk]:
        return self.background_queue if chunk.background else self.queue

    def _queued(self) -> list[PendingChunk]:
        return [*self.queue, *self.background_queue]

    def enqueue(self, chunk: PendingChunk, front: bool = False) -> None:
        """Hold a chunk until a worker has room, in its priority's queue; a requeued chunk goes to the
        front (past the bound: it was admitted once already)."""
        queue = self._queue_of(chunk)
        if not front and len(queue) >= self.max_queued:
            raise QueueFull
        if front:
            queue.appendleft(chunk)
        else:
            queue.append(chunk)
        self.queued_ids.add(chunk.chunk_id)

    def pop_queued(self) -> PendingChunk:
        """The first queued chunk: online ones before background ones."""
        chunk = (self.queue or self.background_queue).popleft()
        self.queued_ids.discard(chunk.chunk_id)
        return chunk

    def waits_ahead(self, chunk: PendingChunk) -> bool:
        """Whether queued chunks go before this new one: any online chunk does, and for a background
        chunk any background chunk too."""
        return bool(self.queue) or (chunk.background and bool(self.background_queue))

    def take_dispatchable(self) -> tuple[PendingChunk, WorkerState] | None:
        """The next queued chunk a worker can take now, taken off its queue, with that worker: online
        chunks first in arrival order; background ones only when no online chunk waits."""
        queue = self.queue or self.background_queue
        if not queue:
            return None
        worker = self.pick_worker(queue[0])
        if worker is None:
            return None
        return self.pop_queued(), worker

    def find(self, chunk_id: str) -> PendingChunk | None:
        """The chunk if it is in flight or queued, else None."""
        if chunk_id in self.queued_ids:
            return next(c for c in self._queued() if c.chunk_id == chunk_id)
        return self.inflight.get(chunk_id)

    def knows(self, chunk_id: str) -> bool:
        """Whether the chunk is queued or in flight (so a second copy of it is a duplicate)."""
        return chunk_id in self.inflight or chunk_id in self.queued_ids

    def _unassign(self, chunk: PendingChunk) -> None:
        worker = self.workers.get(chunk.worker) if chunk.worker is not None else None
        if worker is not None and worker.inflight.pop(chunk.chunk_id, None) is not None:
            worker.outstanding_tokens -= chunk.num_tokens
        chunk.worker = None

    def complete(self, chunk_id: str) -> PendingChunk | None:
        """The chunk's outcome arrived: release it. None when it is not in flight (a duplicate)."""
        chunk = self.inflight.pop(chunk_id, None)
        if chunk is not None:
            self._unassign(chunk)
        return chunk

    def cancel(self, chunk_id: str) -> PendingChunk | None:
        """Drop a chunk: from the queue (returns it, worker None) or from a worker (returns it with
        `worker` still naming who holds it, for the caller to tell)."""
        if chunk_id in self.queued_ids:
            queued = next(c for c in self._queued() if c.chunk_id == chunk_id)
            self._queue_of(queued).remove(queued)
            self.queued_ids.discard(chunk_id)
            return queued
        chunk = self.inflight.get(chunk_id)
        if chunk is None:
            return None
        holder = chunk.worker
        self.complete(chunk_id)
        chunk.worker = holder
        return chunk

    def take_expired_queued(self, now: float) -> list[PendingChunk]:
        expired = [c for c in self._queued() if c.deadline < now]
        for chunk in expired:
            self._queue_of(chunk).remove(chunk)
            self.queued_ids.discard(chunk.chunk_id)
        return expired

    def take_overdue(self, now: float) -> list[tuple[PendingChunk, WorkerState]]:
        """Chunks a live worker has held past their hold deadline, taken back from it (unassigned and
        out of flight, the worker remembered in `former_workers`), with the worker that held each."""
        overdue = [(c, self.workers[c.worker]) for c in self.inflight.values()
                   if c.hold_until < now and c.worker in self.workers]
        for chunk, worker in overdue:
            self.inflight.pop(chunk.chunk_id)
            self._unassign(chunk)
            chunk.former_workers.add(worker.identity)
        return overdue
