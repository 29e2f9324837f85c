"""The broker's book-keeping: live workers, chunks in flight and chunks waiting.

Pure data structures with no sockets (tests/broker/test_dispatch.py drives them directly).
Policy: a chunk goes to the live worker of its model (the fingerprint the chunk names; a chunk naming
none goes to any worker) that supports its task and has the fewest outstanding tokens, provided the
chunk fits under that worker's advertised capacity (an idle worker takes any chunk); otherwise it
waits in its model's pool, first in first out. The pools share one bound on waiting chunks. A chunk held by one worker past its
hold deadline is taken back (`take_overdue`) so the broker can give it to another.

Priority: within each pool, background chunks (bulk jobs) wait behind every online chunk, and across
pools an online head goes before any background head. Each priority has its own bound, so a full
background queue never refuses an online chunk. A worker holds at most `max_background` background
chunks at once, and their tokens do not count against its capacity for online chunks, so background
work never keeps an online chunk from a worker (the worker's scheduler puts online rows first in a step).
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, field
from typing import Callable, Iterator

from quiver.common.protocol import PRIORITY_ONLINE, Routed


# Identities a chunk's answer goes to at most: the frontend's sockets that sent it, latest last.
MAX_SENDERS = 4


@dataclass(slots=True)
class PendingChunk:
    """A chunk the broker owns until its result or error goes back to the frontend that sent it.
    `message` is the CHUNK as received (header checked, array frames unread). `frontends` are the
    identities it came from: one, unless its frontend sent it again from a rebuilt socket; the answer
    goes to each (a closed one drops it), since which copy arrived last says nothing of which socket
    is still open. The header fields the dispatch policy reads are copied out once, at receipt: every
    dispatch decision reads them again, and a header lookup with its conversion costs ten times an
    attribute's."""

    message: Routed
    frontends: list[bytes]
    deadline: float
    attempt: int = 0
    worker: bytes | None = None
    hold_until: float = float("inf")
    # Workers that held the chunk before and lost it (timed out): their late answers are duplicates.
    former_workers: set[bytes] = field(default_factory=set)
    # When it last began to wait in its model's pool (the broker bounds a wait for a model with no worker).
    queued_at: float = 0.0
    chunk_id: str = field(init=False)
    task: str = field(init=False)
    model: str = field(init=False)  # the fingerprint of the model it is for; '' for any worker
    num_tokens: int = field(init=False)
    num_seqs: int = field(init=False)
    background: bool = field(init=False)

    def __post_init__(self) -> None:
        header = self.message.header  # checked by protocol.peek: the types are right
        self.chunk_id = header["chunk_id"]
        self.task = header["task"]
        self.model = header.get("model", "")
        self.num_tokens = header["num_tokens"]
        self.num_seqs = header["num_seqs"]
        self.background = header.get("priority", PRIORITY_ONLINE) != PRIORITY_ONLINE

    def add_sender(self, frontend: bytes) -> None:
        if frontend not in self.frontends:
            self.frontends = [*self.frontends, frontend][-MAX_SENDERS:]


@dataclass(slots=True)
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
    token_dim: int = 0  # width of its TASK_TOKENS result rows
    draining: bool = False
    # What it holds: the chunks, and their sums kept as they come and go (Dispatcher.assign, _unassign).
    inflight: dict[str, PendingChunk] = field(default_factory=dict)
    outstanding_tokens: int = 0
    online_tokens: int = 0
    background_chunks: int = 0

    def serves(self, model: str) -> bool:
        return not model or model == self.fingerprint

    def fits(self, chunk: PendingChunk) -> bool:
        """Whether the chunk fits under the capacity; for an online chunk only online tokens count."""
        if self.draining or chunk.task not in self.tasks or not self.serves(chunk.model):
            return False
        if chunk.background:
            return not self.inflight or self.outstanding_tokens + chunk.num_tokens <= self.capacity_tokens
        return not self.online_tokens or self.online_tokens + chunk.num_tokens <= self.capacity_tokens

    def hold(self, chunk: PendingChunk) -> None:
        self.inflight[chunk.chunk_id] = chunk
        self._count(chunk, 1)

    def release(self, chunk_id: str) -> None:
        chunk = self.inflight.pop(chunk_id, None)
        if chunk is not None:
            self._count(chunk, -1)

    def _count(self, chunk: PendingChunk, sign: int) -> None:
        self.outstanding_tokens += sign * chunk.num_tokens
        if chunk.background:
            self.background_chunks += sign
        else:
            self.online_tokens += sign * chunk.num_tokens


class QueueFull(Exception):
    """The bounded queue of waiting chunks is full."""


@dataclass
class ModelPool:
    """The chunks waiting for a worker of one model, in the order they are to be dispatched: online
    chunks before background ones, each first in first out, a requeued chunk at the front of its
    priority. The order lives here alone (push, head, pop, remove, take)."""

    model: str
    online: collections.deque[PendingChunk] = field(default_factory=collections.deque)
    background: collections.deque[PendingChunk] = field(default_factory=collections.deque)

    def __len__(self) -> int:
        return len(self.online) + len(self.background)

    def __iter__(self) -> Iterator[PendingChunk]:
        return itertools.chain(self.online, self.background)

    def _queue_of(self, chunk: PendingChunk) -> collections.deque[PendingChunk]:
        return self.background if chunk.background else self.online

    def push(self, chunk: PendingChunk, front: bool = False) -> None:
        if front:
            self._queue_of(chunk).appendleft(chunk)
        else:
            self._queue_of(chunk).append(chunk)

    def waits_ahead(self, chunk: PendingChunk) -> bool:
        """Whether waiting chunks go before this new one: any online chunk does, and for a background
        chunk any background chunk too."""
        return bool(self.online) or (chunk.background and bool(self.background))

    def head(self, background: bool) -> PendingChunk | None:
        """The chunk of that priority to dispatch next, left in the pool."""
        queue = self.background if background else self.online
        return queue[0] if queue else None

    def remove(self, chunk: PendingChunk) -> None:
        self._queue_of(chunk).remove(chunk)

    def take(self, condition: Callable[[PendingChunk], bool]) -> list[PendingChunk]:
        """Take out and return the chunks that meet `condition`."""
        taken = [c for c in self if condition(c)]
        for chunk in taken:
            self.remove(chunk)
        return taken


class Dispatcher:
    def __init__(self, max_queued: int, max_background: int = 4) -> None:
        self.workers: dict[bytes, WorkerState] = {}
        # Waiting chunks by the model they name; a pool exists while it holds a chunk.
        self.pools: dict[str, ModelPool] = {}
        self.queued: dict[str, PendingChunk] = {}
        self.inflight: dict[str, PendingChunk] = {}
        self.max_queued = max_queued  # waiting chunks of each priority, over all pools
        self.max_background = max_background  # background chunks one worker holds at most

    @property
    def queued_ids(self) -> set[str]:
        return set(self.queued)

    @property
    def queue(self) -> list[PendingChunk]:
        """Every waiting chunk, pool by pool, each pool in its order."""
        return [chunk for pool in self.pools.values() for chunk in pool]

    # workers ---------------------------------------------------------------------------------
    def add_worker(self, worker: WorkerState) -> None:
        """Register a worker. A READY again from a registered identity is the same process (say, after
        duplicate RECONNECTs): it keeps the chunks it holds."""
        known = self.workers.get(worker.identity)
        if known is not None:
            worker.inflight, worker.outstanding_tokens = known.inflight, known.outstanding_tokens
            worker.online_tokens, worker.background_chunks = known.online_tokens, known.background_chunks
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

    def live_workers(self, model: str) -> int:
        """Registered workers that serve `model` ('': any), draining ones included."""
        return sum(1 for w in self.workers.values() if w.serves(model))

    # chunks ----------------------------------------------------------------------------------
    def pick_worker(self, chunk: PendingChunk) -> WorkerState | None:
        """The fitting worker with the fewest outstanding tokens, one that lost this chunk before last."""
        if chunk.former_workers:
            return self._pick_worker_but_former(chunk)
        best, fewest = None, 0
        background = chunk.background
        for worker in self.workers.values():
            tokens = worker.outstanding_tokens
            if best is not None and tokens >= fewest:
                continue  # not better than the one found, whether or not it fits
            if worker.fits(chunk) and not (background and worker.background_chunks >= self.max_background):
                best, fewest = worker, tokens
                if not tokens:
                    break  # idle: no worker is better
        return best

    def _pick_worker_but_former(self, chunk: PendingChunk) -> WorkerState | None:
        """pick_worker for a chunk taken back from some workers: any other worker goes before those."""
        best, best_key = None, (True, 0)
        for worker in self.workers.values():
            if not worker.fits(chunk) or (chunk.background and worker.background_chunks >= self.max_background):
                continue
            key = (worker.identity in chunk.former_workers, worker.outstanding_tokens)
            if best is None or key < best_key:
                best, best_key = worker, key
                if key == (False, 0):
                    break  # idle and never lost this chunk: no worker is better
        return best

    def assign(self, chunk: PendingChunk, worker: WorkerState, hold_until: float = float("inf")) -> None:
        chunk.worker = worker.identity
        chunk.hold_until = hold_until
        worker.hold(chunk)
        self.inflight[chunk.chunk_id] = chunk

    def enqueue(self, chunk: PendingChunk, front: bool = False, now: float = 0.0) -> None:
        """Hold a chunk in its model's pool until a worker has room; a requeued chunk goes to the front
        (past the bound: it was admitted once already). `now` is when it began to wait."""
        if not front and self._waiting_of_priority(chunk.background) >= self.max_queued:
            raise QueueFull
        pool = self.pools.get(chunk.model)
        if pool is None:
            pool = self.pools[chunk.model] = ModelPool(chunk.model)
        pool.push(chunk, front)
        chunk.queued_at = now
        self.queued[chunk.chunk_id] = chunk

    def _waiting_of_priority(self, background: bool) -> int:
        """Waiting chunks of one priority over every pool (a sum over models, not over chunks)."""
        return sum(len(pool.background if background else pool.online) for pool in self.pools.values())

    def waits_ahead(self, chunk: PendingChunk) -> bool:
        """Whether waiting chunks of its model go before this new one (see ModelPool.waits_ahead)."""
        pool = self.pools.get(chunk.model)
        return pool is not None and pool.waits_ahead(chunk)

    def take_dispatchable(self) -> tuple[PendingChunk, WorkerState] | None:
        """The next waiting chunk a worker can take now, taken out of its pool, with that worker; None
        when there is none. Online heads of every pool go before any background head; each pool waits
        on its own heads, so a model without a free worker holds back no other model."""
        for background in (False, True):
            for pool in list(self.pools.values()):
                chunk = pool.head(background)
                worker = self.pick_worker(chunk) if chunk is not None else None
                if chunk is not None and worker is not None:
                    pool.remove(chunk)
                    self._forget_queued(pool, chunk)
                    return chunk, worker
        return None

    def _forget_queued(self, pool: ModelPool, chunk: PendingChunk) -> None:
        self.queued.pop(chunk.chunk_id, None)
        if not pool:
            self.pools.pop(pool.model, None)

    def find(self, chunk_id: str) -> PendingChunk | None:
        """The chunk if it is in flight or queued, else None."""
        return self.queued.get(chunk_id) or self.inflight.get(chunk_id)

    def knows(self, chunk_id: str) -> bool:
        """Whether the chunk is queued or in flight (so a second copy of it is a duplicate)."""
        return chunk_id in self.inflight or chunk_id in self.queued

    def _unassign(self, chunk: PendingChunk) -> None:
        worker = self.workers.get(chunk.worker) if chunk.worker is not None else None
        if worker is not None:
            worker.release(chunk.chunk_id)
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
        queued = self.queued.get(chunk_id)
        if queued is not None:
            pool = self.pools[queued.model]
            pool.remove(queued)
            self._forget_queued(pool, queued)
            return queued
        chunk = self.inflight.get(chunk_id)
        if chunk is None:
            return None
        holder = chunk.worker
        self.complete(chunk_id)
        chunk.worker = holder
        return chunk

    def take_expired_queued(self, now: float) -> list[PendingChunk]:
        return self.take_queued(lambda chunk: chunk.deadline < now)

    def take_queued(self, condition: Callable[[PendingChunk], bool]) -> list[PendingChunk]:
        """Take out of every pool the waiting chunks that meet `condition`."""
        taken = []
        for pool in list(self.pools.values()):
            for chunk in pool.take(condition):
                self._forget_queued(pool, chunk)
                taken.append(chunk)
        return taken

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
