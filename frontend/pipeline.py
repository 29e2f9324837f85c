"""From tokenized sequences to result rows: split into chunks, send, gather, put back in order.

A request's sequences are cut into contiguous chunks bounded by tokens and by sequence count, so
that one large request spreads over every worker. The chunks go out at once and are awaited
together under the request's deadline; the first failure cancels the rest. Chunks carry the priority
in CURRENT_PRIORITY: online unless the batch runner, or a request's X-Quiver-Priority header, says
background.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

import numpy as np

from quiver.common.config import FrontendSettings
from quiver.common.protocol import PRIORITY_BACKGROUND, PRIORITY_ONLINE, Chunk, ErrorCode, Result
from quiver.common.ragged import RaggedIds
from quiver.frontend import metrics
from quiver.frontend.admission import CURRENT_TICKET, RETRY_AFTER_S, Admission
from quiver.frontend.broker_client import BrokerClient, ChunkFailed
from quiver.frontend.errors import APIError
from quiver.frontend.tasks import await_within
from quiver.frontend.tracing import current_traceparent, record_chunks, record_chunks_failed

CHUNK_ERRORS = {
    ErrorCode.BAD_INPUT.value: "validation",
    ErrorCode.OVERLOADED.value: "overloaded",
    ErrorCode.UNAVAILABLE.value: "unavailable",
    ErrorCode.EXPIRED.value: "timeout",
    ErrorCode.INTERNAL.value: "internal",
}


# The priority of the chunks the current task sends (set by the request prologue and the batch runner).
CURRENT_PRIORITY: contextvars.ContextVar[int] = contextvars.ContextVar("quiver_priority", default=PRIORITY_ONLINE)
PRIORITY_HEADER = "x-quiver-priority"
PRIORITY_NAMES = {"online": PRIORITY_ONLINE, "background": PRIORITY_BACKGROUND}


def requested_priority(value: str | None) -> int:
    """The priority a request's X-Quiver-Priority header asks for: online (the default) or background.

    Any caller may ask for background: it only lowers its own work below everyone's online requests."""
    if value is None:
        return PRIORITY_ONLINE
    priority = PRIORITY_NAMES.get(value.strip().lower())
    if priority is None:
        raise APIError("invalid_request", f"the X-Quiver-Priority header must be 'online' or 'background', "
                                          f"not {value[:40]!r}")
    return priority


@dataclass
class Timings:
    """Seconds spent per stage; queue and inference are the slowest chunk's. device_s sums the chunks'
    inference (a step shared by several chunks counts once for each)."""

    started: float
    tokenization_s: float = 0.0
    queue_s: float = 0.0
    inference_s: float = 0.0
    device_s: float = 0.0

    def headers(self) -> dict[str, str]:
        """Per-stage times in milliseconds, as Text Embeddings Inference reports them."""
        total = time.monotonic() - self.started
        return {
            "x-total-time": f"{total * 1000:.3f}",
            "x-tokenization-time": f"{self.tokenization_s * 1000:.3f}",
            "x-queue-time": f"{self.queue_s * 1000:.3f}",
            "x-inference-time": f"{self.inference_s * 1000:.3f}",
        }


def split_ranges(seq_lens: np.ndarray, max_tokens: int, max_seqs: int) -> list[tuple[int, int]]:
    """Contiguous [start, end) ranges of sequences, each within both budgets (one long sequence alone)."""
    ranges = []
    start, tokens = 0, 0
    for index, length in enumerate(seq_lens.tolist()):
        count = index - start
        if count and (count >= max_seqs or tokens + length > max_tokens):
            ranges.append((start, index))
            start, tokens = index, 0
        tokens += length
    if start < len(seq_lens):
        ranges.append((start, len(seq_lens)))
    return ranges


class Pipeline:
    def __init__(self, client: BrokerClient, settings: FrontendSettings, admission: Admission,
                 model_fingerprint: str = "", model_name: str = "") -> None:
        self.client = client
        self.settings = settings
        self.admission = admission
        self.model_fingerprint = model_fingerprint
        self.model_name = model_name

    async def run(self, seqs: RaggedIds, task: str, normalize: bool, timings: Timings) -> np.ndarray:
        """Float32 [num_seqs, dim] rows in input order, or an APIError saying why not."""
        return np.concatenate([r.values for r in await self.run_results(seqs, task, normalize, timings)], axis=0)

    async def run_results(self, seqs: RaggedIds, task: str, normalize: bool, timings: Timings) -> list[Result]:
        """The chunks' results in input order (dense, or sparse for SPLADE models), or an APIError."""
        await self._require_workers()
        ticket = CURRENT_TICKET.get()
        if ticket is not None:  # reserved from the body's size by the request prologue; now exact
            ticket.settle(seqs.num_tokens)
            return await self._run_chunks(seqs, task, normalize, timings)
        ticket = self.admission.reserve(seqs.num_tokens, estimated=False)
        try:
            return await self._run_chunks(seqs, task, normalize, timings)
        finally:
            ticket.release()

    async def run_overlapped(self, first: RaggedIds, rest: Callable[[], Awaitable[RaggedIds]], task: str,
                             normalize: bool, timings: Timings) -> tuple[np.ndarray, int]:
        """Rows for `first` then for what `rest()` gives, in that order, with the number of tokens of both.

        `first`'s chunks go out at once, while `rest` is still being made (a long request's later inputs
        tokenizing on the pool): its first step runs meanwhile. The request's reservation is settled once
        both are known; a failure of either part cancels the other's chunks."""
        await self._require_workers()
        ticket = CURRENT_TICKET.get()
        own = None
        if ticket is None:
            own = ticket = self.admission.reserve(first.num_tokens, estimated=False)
        first_timings = dataclasses.replace(timings, device_s=0.0)
        first_run = asyncio.ensure_future(self._run_chunks(first, task, normalize, first_timings))
        try:
            later = await rest()
            if first_run.done():
                first_run.result()  # it failed already: its error is the request's
            ticket.settle(first.num_tokens + later.num_tokens)
            later_results = await self._run_chunks(later, task, normalize, timings)
            first_results = await first_run
        finally:
            if not first_run.done():
                first_run.cancel()
                await asyncio.gather(first_run, return_exceptions=True)
            if own is not None:
                own.release()
        timings.queue_s = max(timings.queue_s, first_timings.queue_s)
        timings.inference_s = max(timings.inference_s, first_timings.inference_s)
        timings.device_s += first_timings.device_s
        rows = np.concatenate([r.values for r in (*first_results, *later_results)], axis=0)
        return rows, first.num_tokens + later.num_tokens

    async def _require_workers(self) -> None:
        if not self.client.healthy and not await self.client.recheck_workers():
            reason = "no worker is live" if self.client.broker_alive else "the broker is unreachable"
            raise APIError("unavailable", f"{reason}; try again shortly", headers={"Retry-After": RETRY_AFTER_S})

    def _chunks(self, seqs: RaggedIds, task: str, normalize: bool, timeout_s: float) -> list[Chunk]:
        traceparent = current_traceparent()
        priority = CURRENT_PRIORITY.get()
        ranges = split_ranges(seqs.seq_lens, self.settings.max_chunk_tokens, self.settings.max_chunk_seqs)
        # A request that fits one chunk is sent as it is: slicing it would sum its offsets for nothing.
        parts = [seqs] if len(ranges) == 1 else [seqs.rows(start, end) for start, end in ranges]
        return [
            Chunk.from_ids(part, chunk_id=self.client.new_chunk_id(), task=task, normalize=normalize,
                           timeout_s=timeout_s, priority=priority, model=self.model_fingerprint,
                           traceparent=traceparent)
            for part in parts
        ]

    async def _run_chunks(self, seqs: RaggedIds, task: str, normalize: bool, timings: Timings) -> list[Result]:
        remaining = max(0.0, self.settings.request_timeout_s - (time.monotonic() - timings.started))
        chunks = self._chunks(seqs, task, normalize, remaining)
        metrics.CHUNKS_SENT.inc(len(chunks))
        dispatched = time.monotonic()
        try:
            if len(chunks) == 1:
                results = [await self._await_one(chunks[0], remaining)]
            else:
                results = await self._await_all(chunks, remaining)
        except BaseException as exc:
            record_chunks_failed(dispatched, len(chunks), getattr(exc, "reason", type(exc).__name__))
            raise
        record_chunks(dispatched, results, seqs.num_seqs, seqs.num_tokens)
        timings.queue_s = max(r.queue_s for r in results)
        timings.inference_s = max(r.inference_s for r in results)
        timings.device_s += sum(r.inference_s for r in results)
        return results

    async def _await_one(self, chunk: Chunk, remaining: float) -> Result:
        """A lone chunk is awaited in the request's own task: its answer wakes the request directly, with
        no task of its own to schedule and join (two turns of the event loop less per request)."""
        try:
            return await await_within(self.client.submit(chunk), remaining)
        except ChunkFailed as exc:
            raise self._failed(exc) from None
        except TimeoutError:
            raise self._timed_out() from None

    async def _await_all(self, chunks: list[Chunk], remaining: float) -> list[Result]:
        """Every chunk in a task of its own, all in flight at once; the first failure cancels the rest
        (each cancelled submit tells the broker to drop its chunk)."""
        tasks = [asyncio.ensure_future(self.client.submit(chunk)) for chunk in chunks]
        try:
            done, pending = await asyncio.wait(tasks, timeout=remaining, return_when=asyncio.FIRST_EXCEPTION)
            for task_ in done:
                exc = task_.exception()
                if isinstance(exc, ChunkFailed):
                    raise self._failed(exc)
                if exc is not None:
                    raise exc
            if pending:
                raise self._timed_out()
        finally:
            for task_ in tasks:
                task_.cancel()
        return [task_.result() for task_ in tasks]

    def _failed(self, exc: ChunkFailed) -> APIError:
        message = exc.message
        if exc.code == ErrorCode.UNAVAILABLE.value and self.model_name:
            message = f"model {self.model_name!r}: {message}"
        return APIError(CHUNK_ERRORS.get(exc.code, "internal"), message,
                        headers={"Retry-After": RETRY_AFTER_S} if exc.code in ("overloaded", "unavailable") else {})

    def _timed_out(self) -> APIError:
        if not self.client.broker_alive:
            return APIError("unavailable", "the broker became unreachable and did not come back before "
                            "the request's deadline", headers={"Retry-After": RETRY_AFTER_S})
        return APIError("timeout", f"the request did not finish within {self.settings.request_timeout_s:g} s")
