"""The worker's steps: chunks in, steps launched on the engine, rows out to the chunks' answers.

The Scheduler is the one owner of the worker's chunks. It validates each arriving chunk and hands it to
the StepPlanner (planner.py), which decides which waiting rows go into each step (first come, first
served under a token budget, online work before bulk work); it launches the planned steps, copies their
rows into their chunks and answers each chunk once its rows are all in.

A step runs on the device while the scheduler does the CPU side of the step before (scatter the rows,
answer finished chunks) and collects arrivals. The next step is launched when the running one is done,
with everything that is waiting by then, so that under load a step takes all waiting requests up to the
budget instead of many small steps queueing behind each other. One exception, which costs no one a
place: a step that no later arrival could join (online rows up to the shared cap, the budget or the
sequence cap) is launched as soon as it is known, queued on the device behind the running step, so the
device goes from one to the next without waiting for the host (a long request's later chunks, or 16
clients' rows beyond one shared step). At most one step is queued so. The engine is reached through
StepEngine (the real Engine satisfies it; tests use the real one on CPU); this module does not import
torch itself, but the engine package it takes Batch from does.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import threading
import time
from typing import Callable

import numpy as np

from quiver.common.model_info import KIND_SPARSE
from quiver.common.protocol import Cancel, Chunk, Error, ErrorCode, Message, Result
from quiver.common.ragged import RaggedError, RaggedLimits
from quiver.worker import metrics
from quiver.worker.engine.batch import Batch
from quiver.worker.host_memory import TRIM_EVERY_STEPS, release_free_memory
from quiver.worker.planner import StepPlanner
from quiver.worker.steps import ChunkJob, Inbox, InFlightBatch, SequenceRef, StepEngine, is_out_of_memory
from quiver.worker.tracing import ChunkTracer

log = logging.getLogger("quiver.worker.scheduler")


IDLE_POLL_S = 0.1  # an idle loop wakes this often (for the stop flag and the watchdog)


class Scheduler:
    def __init__(self, engine: StepEngine, send: Callable[[Message], None], worker_name: str,
                 max_batch_tokens: int, max_batch_seqs: int, chunk_tracer: ChunkTracer | None = None,
                 background_step_tokens: int = 0, quiet_background_step_tokens: int = 0,
                 shared_step_tokens: int = 0, wait_turn: Callable[[], None] | None = None,
                 queue_steps: bool = True) -> None:
        self.engine = engine
        self.queue_steps = queue_steps  # closed steps may be launched behind the running one
        # Called between polls of a running step's event: the inline link's wait_turn, or a bare yield.
        self.wait_turn = wait_turn or os.sched_yield
        self.plan_stale = False  # while a step runs: whether arrivals may have closed the next step
        self.chunk_tracer = chunk_tracer  # None unless tracing is on
        self.tasks = engine.info.model.tasks
        self.sparse_results = engine.info.model.kind == KIND_SPARSE  # SPLADE rows travel as their non-zeros
        self.send = send
        self.worker_name = worker_name
        self.planner = StepPlanner(max_batch_tokens, max_batch_seqs, str(engine.info.device).partition(":")[0],
                                   expire=self._expire, background_step_tokens=background_step_tokens,
                                   quiet_background_step_tokens=quiet_background_step_tokens,
                                   shared_step_tokens=shared_step_tokens)
        model = engine.info.model
        type_vocab_size = int(model.config.get("type_vocab_size", 1) or 1) if model.uses_token_types else None
        self.limits = RaggedLimits(vocab_size=model.vocab_size, max_length=model.max_input_length,
                                   type_vocab_size=type_vocab_size)
        self.jobs: dict[str, ChunkJob] = {}
        self.steps = 0
        self.busy_until = 0.0  # when the device last finished a step (for the busy-time counter)
        self.trimmed_at_step = 0
        self.loop_at = time.monotonic()

    # intake ------------------------------------------------------------------------------------
    def accept(self, message: Chunk | Cancel) -> None:
        if isinstance(message, Cancel):
            job = self.jobs.pop(message.chunk_id, None)
            if job is not None:
                job.closed = True
                metrics.CHUNKS.labels("cancelled").inc()
            return
        if message.chunk_id in self.jobs:
            return  # the broker sent it again; the first copy will answer
        problem = self._check(message)
        if problem:
            self._fail_chunk(message.chunk_id, ErrorCode.BAD_INPUT, problem)
            return
        now = time.monotonic()
        job = ChunkJob(chunk=message, received=now, deadline=now + message.timeout_s, rows_left=message.num_seqs)
        self.jobs[message.chunk_id] = job
        self.planner.add(job, now)

    def _check(self, chunk: Chunk) -> str:
        """Why this worker cannot run the chunk ("" when it can): the worker's one validation of its ids."""
        if chunk.task not in self.tasks:
            return f"this worker's model does not do {chunk.task!r}"
        try:
            chunk.ids.validate(self.limits)
        except RaggedError as exc:
            return f"the chunk's token ids do not fit this model: {exc}"
        return ""

    # batching ----------------------------------------------------------------------------------
    def next_batch(self, closed_only: bool = False) -> tuple[Batch, list[SequenceRef]] | None:
        """The next step's batch and rows, planned by the StepPlanner (closed_only: see StepPlanner.closed)."""
        return self.planner.next_batch(closed_only)

    # results -----------------------------------------------------------------------------------
    def launch(self, batch: Batch, refs: list[SequenceRef]) -> InFlightBatch:
        """Launch the step; its size is recorded after the launch, while the device works."""
        launched = time.monotonic()
        flight = InFlightBatch(lazy=self.engine.step(batch), refs=refs, launched=launched)
        metrics.BATCH_SEQUENCES.observe(batch.num_seqs)
        metrics.BATCH_TOKENS.observe(batch.num_tokens)
        metrics.STEP_CHUNKS.observe(len({id(ref.job) for ref in refs}))
        return flight

    def finish(self, flight: InFlightBatch) -> None:
        """Wait for a launched batch, copy its rows into their chunks, answer the finished chunks."""
        try:
            rows = flight.lazy.wait(copy=False)  # read in place: _scatter copies the rows to their chunks
            self._count_busy(flight)
        except BaseException:
            flight.lazy.release()
            raise
        self._close_flight(flight, rows)

    def _count_busy(self, flight: InFlightBatch) -> None:
        """The step's device time (recorded in metrics by _close_step, once its chunks are answered)."""
        done = time.monotonic()
        flight.device_s = max(0.0, done - max(flight.launched, self.busy_until))
        self.busy_until = done

    def _close_step(self, flight: InFlightBatch) -> None:
        self.steps += 1
        for job in {id(ref.job): ref.job for ref in flight.refs}.values():
            job.inference_s += flight.device_s
            job.steps += 1
            if job.rows_left == 0 and not job.closed:
                self._answer(job)
        metrics.GPU_BUSY_SECONDS.inc(flight.device_s)
        metrics.STEP_SECONDS.observe(flight.device_s)

    def _scatter(self, rows: np.ndarray, flight: InFlightBatch) -> None:
        if flight.refs and flight.refs[0].job.row_kind:
            self._scatter_tokens(rows, flight)
            return
        # A step's rows of one chunk are mostly consecutive: each such run is copied as one slice.
        refs = flight.refs
        start = 0
        while start < len(refs):
            job, first_row = refs[start].job, refs[start].row
            end = start + 1
            while end < len(refs) and refs[end].job is job and refs[end].row == first_row + end - start:
                end += 1
            if not job.closed:
                if job.values is None:
                    job.values = np.empty((job.chunk.num_seqs, rows.shape[1]), dtype=np.float32)
                job.values[first_row:first_row + end - start] = rows[start:end]
                job.rows_left -= end - start
            start = end

    @staticmethod
    def _scatter_tokens(rows: np.ndarray, flight: InFlightBatch) -> None:
        """Token rows: each sequence's run of rows goes to its place among its chunk's tokens."""
        start = 0
        for ref in flight.refs:
            job, length = ref.job, ref.length
            if not job.closed:
                if job.values is None:
                    job.values = np.empty((job.chunk.num_tokens, rows.shape[1]), dtype=np.float32)
                job.values[job.chunk.ids.offsets[ref.row]:job.chunk.ids.offsets[ref.row + 1]] = rows[start:start + length]
                job.rows_left -= 1
            start += length

    def fail_batch(self, refs: list[SequenceRef], exc: BaseException) -> None:
        """Fail every still-open chunk that had a sequence in `refs`."""
        for job in {id(ref.job): ref.job for ref in refs}.values():
            if not job.closed:
                self._close(job)
                self._fail_chunk(job.chunk.chunk_id, ErrorCode.INTERNAL, f"the model failed: {exc}")
                self._trace(job, ErrorCode.INTERNAL.value)

    def recover(self, refs: list[SequenceRef], exc: BaseException) -> None:
        """A batch failed: run its sequences again once, in two halves. Out of memory keeps halving
        down to single sequences; what still fails fails its chunks, and nothing else."""
        metrics.FAILED_BATCHES.labels("out_of_memory" if is_out_of_memory(exc) else "error").inc()
        log.warning("a batch of %d sequences failed (%s: %s); retrying in smaller batches",
                    len(refs), type(exc).__name__, exc)
        live = [ref for ref in refs if not ref.job.closed]
        middle = len(live) // 2
        for part in (live[:middle], live[middle:]) if len(live) > 1 else (live,):
            part = [ref for ref in part if not ref.job.closed]
            if not part:
                continue
            try:
                self.finish(self.launch(StepPlanner.assemble(part), part))
            except Exception as again:  # noqa: BLE001 - whatever the model raised fails these chunks only
                if is_out_of_memory(again) and len(part) > 1:
                    self.recover(part, again)
                else:
                    log.error("retry of %d sequences failed too: %s", len(part), again)
                    self.fail_batch(part, again)

    def _answer(self, job: ChunkJob) -> None:
        self._close(job)
        assert job.values is not None and job.started is not None
        result = Result(chunk_id=job.chunk.chunk_id, num_seqs=job.chunk.num_seqs, dim=job.values.shape[1],
                        queue_s=job.started - job.received, inference_s=job.inference_s,
                        worker=self.worker_name, values=job.values,
                        num_rows=job.chunk.num_tokens if job.row_kind else None)
        self.send(result.to_sparse() if self.sparse_results and result.num_rows is None else result)
        metrics.CHUNKS_OK.inc()
        self._trace(job)

    def _trace(self, job: ChunkJob, error: str = "") -> None:
        if self.chunk_tracer is not None and job.chunk.traceparent:
            self.chunk_tracer.record(job.chunk, job.received, job.started, job.steps, job.inference_s, error)

    def _expire(self, job: ChunkJob) -> None:
        self._close(job)
        self._fail_chunk(job.chunk.chunk_id, ErrorCode.EXPIRED, "the request's deadline passed before it ran")
        self._trace(job, ErrorCode.EXPIRED.value)

    def _close(self, job: ChunkJob) -> None:
        job.closed = True
        self.jobs.pop(job.chunk.chunk_id, None)

    def _fail_chunk(self, chunk_id: str, code: ErrorCode, reason: str) -> None:
        metrics.CHUNKS.labels(code.value).inc()
        self.send(Error(chunk_id=chunk_id, code=code.value, message=reason, worker=self.worker_name))

    # loop --------------------------------------------------------------------------------------
    def run(self, inbox: Inbox, stop: threading.Event, drain: threading.Event) -> None:
        """Serve until `stop`; after `drain`, finish what is held and return."""
        flights: collections.deque[InFlightBatch] = collections.deque()  # the running step, then a queued one
        while not stop.is_set():
            self.loop_at = time.monotonic()
            idle = not flights and not self.planner.waiting
            if idle and drain.is_set() and inbox.empty():
                return
            if self.steps - self.trimmed_at_step >= TRIM_EVERY_STEPS:
                self._trim()
            self._absorb(inbox, block=idle)
            done = rows = None
            if flights:
                done = flights.popleft()
                self.plan_stale = True
                try:
                    rows = done.lazy.wait(copy=False, while_pending=lambda: self._while_step_runs(inbox, flights))
                    self._count_busy(done)
                except Exception as exc:  # noqa: BLE001 - a failing forward costs its batch at most, never the worker
                    done.lazy.release()
                    self.recover(done.refs, exc)
                    done = None
                self._absorb(inbox, block=False)
            if flights:
                # A queued step runs now: the finished step's CPU side first (it frees its result slot),
                # then another step behind this one only if no later arrival could join it.
                self._close_flight(done, rows)
                self._launch_next(flights, queued=True)
            else:
                # The device is idle: everything that is waiting by now goes in the next step, and the
                # CPU side of the finished step runs while the device works.
                self._launch_next(flights, queued=False)
                self._close_flight(done, rows)
            metrics.QUEUE_DEPTH.set(self.planner.waiting_seqs)
            metrics.INFLIGHT_CHUNKS.set(len(self.jobs))
            metrics.loop_tick()  # the loop went round: its timestamp, and systemd's watchdog
        while flights:
            self.finish(flights.popleft())

    def _while_step_runs(self, inbox: Inbox, flights: collections.deque[InFlightBatch]) -> None:
        """One turn of the wait for a running step (flights then holds any step queued behind it): the
        CPU goes to other threads for a moment, arrivals are taken in, and a step no later arrival could
        join is queued behind the running one if none is yet."""
        self.wait_turn()
        if self._absorb(inbox, block=False):
            self.plan_stale = True
        if self.plan_stale and self.queue_steps and not flights and self.planner.waiting:
            self.plan_stale = False  # the waiting set is planned again only once something arrives
            self._launch_next(flights, queued=True)

    def _launch_next(self, flights: collections.deque[InFlightBatch], queued: bool) -> None:
        """Launch the next step into `flights`; queued (behind a running step): only a closed one."""
        picked = self.next_batch(closed_only=queued)
        if picked is None:
            return
        try:
            flights.append(self.launch(*picked))
        except Exception as exc:  # noqa: BLE001 - as a failing forward: its batch at most
            self.recover(picked[1], exc)
            return
        if queued:
            metrics.QUEUED_STEPS.inc()

    def _close_flight(self, flight: InFlightBatch | None, rows: np.ndarray | None) -> None:
        """The CPU side of a finished step: its rows to their chunks, its slot released, chunks answered."""
        if flight is None or rows is None:
            return
        try:
            self._scatter(rows, flight)
        finally:
            flight.lazy.release()
        self._close_step(flight)

    def stalled_for(self, now: float) -> float:
        """Seconds since the loop last went round: long only when a step hangs."""
        return now - self.loop_at

    def _trim(self) -> None:
        release_free_memory()
        self.trimmed_at_step = self.steps

    def _absorb(self, inbox: Inbox, block: bool) -> bool:
        """Accept what the inbox holds (waiting up to IDLE_POLL_S for the first when `block`); whether any."""
        try:
            self.accept(inbox.get(timeout=IDLE_POLL_S) if block else inbox.get_nowait())
        except queue.Empty:
            if block and self.steps > self.trimmed_at_step:
                self._trim()  # idle for a while: a good moment, off every request's path
            return False
        while True:
            try:
                self.accept(inbox.get_nowait())
            except queue.Empty:
                return True
