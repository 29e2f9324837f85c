"""An OTLP/HTTP trace collector for tests: an http.server on loopback, in a thread, that decodes each
POST /v1/traces body as opentelemetry-proto's ExportTraceServiceRequest and keeps the spans it holds."""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

SERVER, CONSUMER = 2, 5  # opentelemetry.proto.trace.v1.Span.SpanKind
STATUS_UNSET, STATUS_ERROR = 0, 2  # opentelemetry.proto.trace.v1.Status.StatusCode


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


@dataclass
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status: int


class Collector:
    """An OTLP/HTTP trace receiver on loopback: decodes ExportTraceServiceRequest bodies and keeps the spans."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                encoding = self.headers.get("content-encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                collector.add(request)
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def add(self, request: Any) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    spans.append(ReceivedSpan(
                        service=resource.get("service.name", ""), name=span.name, trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(), parent_span_id=span.parent_span_id.hex(), kind=span.kind,
                        start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano,
                        attributes={a.key: _value(a.value) for a in span.attributes}, status=span.status.code))
        with self.lock:
            self.spans.extend(spans)

    def wait_for(self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float = 60.0) -> list[ReceivedSpan]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                spans = list(self.spans)
            if predicate(spans):
                return spans
            time.sleep(0.05)
        raise AssertionError(f"the collector did not receive the expected spans in {timeout} s; it has "
                             f"{[(s.service, s.name, s.trace_id) for s in self.spans]}")

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
