"""OpenTelemetry tracing shared by the frontend and the workers: OTLP/HTTP export, W3C trace context.

Tracing is off unless --otlp-endpoint is set. Nothing here imports opentelemetry at module level: a
server without the `otel` extra installed and without an endpoint never loads it. With an endpoint,
spans are queued by the SDK's BatchSpanProcessor and exported from its own thread as OTLP/HTTP protobuf
(POST {endpoint}/v1/traces), so a slow or absent collector never holds up a request.

Stage spans are built after the fact from time.monotonic() readings taken on the request path;
`WallClock` turns those into the epoch nanoseconds OpenTelemetry wants.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from quiver.common.protocol import MAX_TRACEPARENT_CHARS
from quiver.common.version import __version__

TRACES_PATH = "/v1/traces"
INSTALL_HINT = "pip install 'quiver[otel]'"
SHUTDOWN_TIMEOUT_S = 2.0  # spans still queued at exit get this long to reach the collector
# W3C Trace Context (https://www.w3.org/TR/trace-context/#traceparent-header).
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


class TracingError(ValueError):
    """--otlp-endpoint cannot be used as given; the message says why in one line."""


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of an endpoint: http://collector:4318 -> http://collector:4318/v1/traces;
    a URL that already ends in /v1/traces is kept."""
    endpoint = endpoint.strip()
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TracingError(f"--otlp-endpoint {endpoint!r} is not an http:// or https:// URL "
                           f"(an OTLP/HTTP collector, e.g. http://localhost:4318)")
    if parts.query or parts.fragment:
        raise TracingError(f"--otlp-endpoint {endpoint!r}: give the collector's URL without a query or fragment")
    path = parts.path.rstrip("/")
    if not path.endswith(TRACES_PATH):
        path += TRACES_PATH
    return f"{parts.scheme}://{parts.netloc}{path}"


def tracing_problem(endpoint: str) -> str:
    """Why tracing to `endpoint` cannot start (a malformed URL, the packages missing), or "" when it can
    or when no endpoint is set. Checked at start-up: a role answers it with exit status 2."""
    if not endpoint:
        return ""
    try:
        traces_url(endpoint)
    except TracingError as exc:
        return str(exc)
    try:
        import opentelemetry.exporter.otlp.proto.http.trace_exporter
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError as exc:
        return f"--otlp-endpoint is set but OpenTelemetry is not installed ({exc.name} is missing): {INSTALL_HINT}"
    return ""


def parse_traceparent(value: str) -> tuple[int, int, int] | None:
    """(trace id, parent span id, flags) of a W3C traceparent, or None when it is malformed: another
    format, version ff, an all-zero id, or extra fields on version 00."""
    match = _TRACEPARENT.match(value) if len(value) <= MAX_TRACEPARENT_CHARS else None
    if match is None:
        return None
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest) or int(trace_id, 16) == 0 or int(span_id, 16) == 0:
        return None
    return int(trace_id, 16), int(span_id, 16), int(flags, 16)


def format_traceparent(trace_id: int, span_id: int, flags: int) -> str:
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"


def remote_parent(traceparent: str) -> Any:
    """An OpenTelemetry context whose parent is the span a traceparent names; None when malformed."""
    from opentelemetry import trace

    parsed = parse_traceparent(traceparent)
    if parsed is None:
        return None
    trace_id, span_id, flags = parsed
    parent = trace.SpanContext(trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(flags & 0x01))
    return trace.set_span_in_context(trace.NonRecordingSpan(parent))


@dataclass(frozen=True)
class WallClock:
    """Maps time.monotonic() readings to epoch nanoseconds from one pair of readings taken together."""

    wall_ns: int
    monotonic: float

    @classmethod
    def now(cls) -> WallClock:
        return cls(time.time_ns(), time.monotonic())

    def ns(self, monotonic: float) -> int:
        return self.wall_ns + int((monotonic - self.monotonic) * 1e9)


class Tracing:
    """One process's tracer: an SDK TracerProvider exporting in batches over OTLP/HTTP."""

    def __init__(self, endpoint: str, service_name: str, role: str) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self.url = traces_url(endpoint)
        resource = Resource.create({"service.name": service_name, "service.version": __version__,
                                    "quiver.role": role})
        # The sampler and the batch processor's delay and sizes follow the OTEL_* environment variables.
        # shutdown() below bounds the wait at exit; the SDK's own exit hook would wait up to 30 s.
        self.provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=self.url)))
        self.tracer = self.provider.get_tracer("quiver", __version__)

    def shutdown(self) -> None:
        """Export what is queued, waiting at most SHUTDOWN_TIMEOUT_S for the collector (the SDK's own
        shutdown waits up to 30 s when the collector does not answer)."""
        flush = threading.Thread(target=self.provider.shutdown, name="otel-shutdown", daemon=True)
        flush.start()
        flush.join(SHUTDOWN_TIMEOUT_S)
