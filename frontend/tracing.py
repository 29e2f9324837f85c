"""Request tracing in the frontend: one SERVER span per HTTP request, with tokenize, queue and inference
children, parented on the client's W3C `traceparent` header when it sends one.

The request prologue (frontend/http.py) opens a RequestTrace for each traced route and makes it the
current one, a context variable that the handler's task inherits. Tokenization (frontend/tokenization.py)
and the pipeline (frontend/pipeline.py) report their stages to it through the functions below, which
return at once when the request is not traced, and the pipeline puts the request span's traceparent on
every chunk, so that the worker's span of the chunk joins the same trace. The children are written when
the request ends, from the monotonic times each stage took:

- tokenize: one per tokenization call of the request, as long as the call took.
- queue: from handing the chunks to the broker until the inference span begins. The frontend cannot see
  when a worker started, so this covers the broker, the wire both ways and the worker's queue; the
  longest queue time a worker reported is its attribute quiver.worker_queue_s.
- inference: the longest inference time a worker reported for the chunks, ending when the last result
  arrived.

A request whose chunks failed has a queue span up to the failure, with status ERROR.
"""

from __future__ import annotations

import contextvars
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from starlette.requests import Request

from quiver.common.protocol import Result
from quiver.common.tracing import Tracing, WallClock, format_traceparent

# Probes and scrapes, polled every few seconds, would drown the traces of real requests.
UNTRACED_PATHS = frozenset({"/health", "/metrics"})


@dataclass
class Stage:
    name: str
    started: float  # time.monotonic()
    ended: float
    attributes: dict[str, Any] = field(default_factory=dict)
    error: str = ""


class RequestTrace:
    """The span of one HTTP request and the stages reported while it runs."""

    def __init__(self, tracing: Tracing, span: Any, clock: WallClock) -> None:
        self.tracing = tracing
        self.span = span
        self.clock = clock
        self.stages: list[Stage] = []
        self.open = span.is_recording()  # a request sampled out records nothing and traces no chunk
        self.sequences = 0
        self.tokens = 0
        context = span.get_span_context()
        self.traceparent = (format_traceparent(context.trace_id, context.span_id, context.trace_flags)
                            if self.open else "")

    def add(self, stage: Stage) -> None:
        if self.open:
            self.stages.append(stage)

    def finish(self, status: int, failure: str, model: str) -> None:
        """End the request's span with its HTTP status (failure: the error's reason, if any; model: the
        served model the request was given to, '' if it got that far) and write its stages as child spans."""
        from opentelemetry import trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        ended = time.monotonic()
        span = self.span
        if self.open:
            self.open = False
            span.set_attribute("http.response.status_code", status)
            if model:
                span.set_attribute("quiver.model", model)
            if self.sequences:
                span.set_attribute("quiver.request.sequences", self.sequences)
                span.set_attribute("quiver.request.tokens", self.tokens)
            if failure:
                span.set_attribute("error.type", failure)
            # OpenTelemetry's HTTP conventions: a server span is in error for a 5xx answer; a client's
            # mistake (4xx) is the client's error, named by error.type but not the server span's status.
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR, failure or f"HTTP {status}"))
            parent = trace.set_span_in_context(span)
            for stage in self.stages:
                child = self.tracing.tracer.start_span(stage.name, context=parent, kind=SpanKind.INTERNAL,
                                                       attributes=stage.attributes,
                                                       start_time=self.clock.ns(stage.started))
                if stage.error:
                    child.set_status(Status(StatusCode.ERROR, stage.error))
                child.end(end_time=self.clock.ns(stage.ended))
        span.end(end_time=self.clock.ns(ended))


CURRENT_TRACE: contextvars.ContextVar[RequestTrace | None] = contextvars.ContextVar("quiver_trace", default=None)


class RequestTracer:
    """Opens a RequestTrace per HTTP request; one per frontend process, over its Tracing."""

    def __init__(self, tracing: Tracing) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.tracing = tracing
        self.propagator = TraceContextTextMapPropagator()

    def start(self, request: Request, method: str, route: str) -> RequestTrace:
        """Open the request's span, a child of the client's traceparent when it sent a valid one, and make
        it the current trace."""
        from opentelemetry.trace import SpanKind

        parent = self.propagator.extract(request.headers)
        clock = WallClock.now()
        attributes = {"http.request.method": method, "http.route": route, "url.path": request.url.path}
        agent = request.headers.get("user-agent")
        if agent:
            attributes["user_agent.original"] = agent[:256]
        span = self.tracing.tracer.start_span(f"{method} {route}", context=parent, kind=SpanKind.SERVER,
                                              attributes=attributes, start_time=clock.wall_ns)
        trace = RequestTrace(self.tracing, span, clock)
        CURRENT_TRACE.set(trace)
        return trace

    def shutdown(self) -> None:
        self.tracing.shutdown()


def current_traceparent() -> str:
    """The traceparent chunks of the current request carry: its span's, or "" when it is not traced."""
    trace = CURRENT_TRACE.get()
    return trace.traceparent if trace is not None and trace.open else ""


def record_tokenization(started: float) -> None:
    """A tokenization call of the current request ran from `started` until now."""
    trace = CURRENT_TRACE.get()
    if trace is not None:
        trace.add(Stage("tokenize", started, time.monotonic()))


def record_chunks(dispatched: float, results: Sequence[Result], sequences: int, tokens: int) -> None:
    """The current request's chunks, handed to the broker at `dispatched`, have all been answered now."""
    trace = CURRENT_TRACE.get()
    if trace is None or not trace.open:
        return
    answered = time.monotonic()
    inference_s = max(result.inference_s for result in results)
    began = max(dispatched, answered - inference_s)
    trace.sequences += sequences
    trace.tokens += tokens
    trace.add(Stage("queue", dispatched, began, {
        "quiver.chunks": len(results), "quiver.worker_queue_s": max(result.queue_s for result in results)}))
    trace.add(Stage("inference", began, answered, {
        "quiver.inference_s": inference_s, "quiver.workers": sorted({result.worker for result in results})}))


def record_chunks_failed(dispatched: float, chunks: int, reason: str) -> None:
    """The current request's chunks, handed to the broker at `dispatched`, failed now."""
    trace = CURRENT_TRACE.get()
    if trace is not None:
        trace.add(Stage("queue", dispatched, time.monotonic(), {"quiver.chunks": chunks}, error=reason))
