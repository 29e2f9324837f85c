"""The worker's part of a request's trace: one span per traced chunk, a child of the frontend's request span.

A chunk carries the traceparent of the request it belongs to (empty when the request is not traced). When
tracing is on, the scheduler hands each traced chunk it answers or fails to `ChunkTracer.record`, which writes a
CONSUMER span "worker.chunk" from the chunk's arrival at this worker to its answer, with its size, the
steps it took, and its queue and inference times. A malformed traceparent is ignored: the chunk runs as
any other and no span is written. With tracing off the scheduler holds no ChunkTracer and does nothing
per chunk.
"""

from __future__ import annotations

from quiver.common.protocol import Chunk
from quiver.common.tracing import Tracing, WallClock, remote_parent


class ChunkTracer:
    def __init__(self, tracing: Tracing, worker_name: str) -> None:
        self.tracing = tracing
        self.worker_name = worker_name

    def record(self, chunk: Chunk, received: float, started: float | None, steps: int, inference_s: float,
               error: str = "") -> None:
        """Write the span of one chunk that arrived at `received` and started its first
        step at `started` (None: it never ran), ending now."""
        from opentelemetry.trace import SpanKind, Status, StatusCode

        parent = remote_parent(chunk.traceparent)
        if parent is None:
            return
        clock = WallClock.now()
        queue_s = (started if started is not None else clock.monotonic) - received
        span = self.tracing.tracer.start_span("worker.chunk", context=parent, kind=SpanKind.CONSUMER,
                                              start_time=clock.ns(received), attributes={
                                                  "quiver.chunk_id": chunk.chunk_id,
                                                  "quiver.task": chunk.task,
                                                  "quiver.rows": chunk.num_seqs,
                                                  "quiver.tokens": chunk.num_tokens,
                                                  "quiver.attempt": chunk.attempt,
                                                  "quiver.steps": steps,
                                                  "quiver.queue_s": queue_s,
                                                  "quiver.inference_s": inference_s,
                                                  "quiver.worker": self.worker_name,
                                              })
        if error:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=clock.wall_ns)

    def shutdown(self) -> None:
        self.tracing.shutdown()


def chunk_tracer(endpoint: str, service_name: str, worker_name: str) -> ChunkTracer | None:
    """The worker's tracer when --otlp-endpoint is set (checked at start-up), else None."""
    if not endpoint:
        return None
    return ChunkTracer(Tracing(endpoint, service_name or "quiver-worker", "worker"), worker_name)
