"""HTTP connection guards uvicorn lacks: a header deadline, a header size cap and a connection cap.

uvicorn closes idle keep-alive connections (--keep-alive-timeout-s) but waits forever for the
request line and headers of a new connection, so a slowloris client (or 20,000 idle sockets) holds
file descriptors until the process runs out. GuardedHttpToolsProtocol is uvicorn's httptools
protocol with three more rules, each cut counted in quiver_frontend_connections_cut_total:

- a request's line and headers must arrive within header_timeout_s of the connection opening, or of
  the previous response on a kept-alive connection (the keep-alive timeout covers the wait before
  the first byte); else the connection is closed;
- they may take at most max_header_bytes; beyond that the connection is answered 431 and closed;
- a process holds at most max_connections connections; one over is closed as it opens.

The body's own deadline (body_timeout_s, 408) is enforced where the body is read (frontend/http.py).

It also sends a response's head and body in one write (see HeadHoldingTransport).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from quiver.common.config import FrontendSettings
from quiver.frontend import metrics

_TOO_LARGE_BODY = b'{"error":"the request line and headers are too large","error_type":"Validation"}'
HEADERS_TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                     b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_TOO_LARGE_BODY), _TOO_LARGE_BODY))


class HeadersTooLarge(Exception):
    """The request line and headers passed max_header_bytes."""


class HeadHoldingTransport:
    """A connection's transport that holds back the first write after a request's headers arrive (the
    response's status line and headers) until the next write, or at the latest the end of this turn of
    the event loop. uvicorn writes a response's head and its body separately: joined, they leave in one
    send instead of two, and reach the client as one TCP segment. Everything else is the transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self.hold_next = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._held is not None:
            data, self._held = self._held + data, None
        elif self.hold_next:
            self.hold_next = False
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
            return
        self._transport.write(data)

    def flush(self) -> None:
        """Write what is held, if anything (dropped when the connection is already closing)."""
        if self._held is not None:
            held, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    header_timeout_s = 10.0
    max_header_bytes = 65536
    max_connections = 512

    @classmethod
    def configure(cls, settings: FrontendSettings) -> None:
        """Take the limits from the settings (in each HTTP process, before it serves)."""
        cls.header_timeout_s = settings.header_timeout_s
        cls.max_header_bytes = settings.max_header_bytes
        cls.max_connections = settings.max_connections

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_deadline: asyncio.TimerHandle | None = None
        self._header_bytes = self._raw_header_bytes = 0
        self._reading_headers = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_holding = HeadHoldingTransport(transport, self.loop)
        super().connection_made(self._head_holding)  # type: ignore[arg-type]
        if len(self.connections) > self.max_connections:
            self._cut("too_many_connections")
            return
        self._reading_headers = True
        self._arm_deadline(self.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._reading_headers and not self.transport.is_closing():
            # Headers still arriving: the parser buffers an unfinished header, so count the raw bytes too.
            self._raw_header_bytes += len(data)
            if self._raw_header_bytes > self.max_header_bytes:
                self._refuse_headers()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading_headers = True
        self._header_bytes = self._raw_header_bytes = 0

    def on_url(self, url: bytes) -> None:
        self._count_header_bytes(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_header_bytes(len(name) + len(value))
        super().on_header(name, value)

    def _count_header_bytes(self, count: int) -> None:
        """Past the cap, raising out of the parser's callback makes uvicorn answer through send_400_response."""
        self._header_bytes += count
        if self._header_bytes > self.max_header_bytes:
            raise HeadersTooLarge

    def send_400_response(self, msg: str) -> None:
        if self._header_bytes <= self.max_header_bytes:
            super().send_400_response(msg)
        else:
            self._refuse_headers()

    def _refuse_headers(self) -> None:
        self.transport.write(HEADERS_TOO_LARGE)
        self._cut("header_too_large")

    def on_headers_complete(self) -> None:
        self._reading_headers = False
        self._stop_deadline()
        self._head_holding.hold_next = True
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        waiting = bool(self.pipeline)  # a pipelined request whose headers are already in
        super().on_response_complete()
        if not waiting and not self.transport.is_closing():
            # uvicorn's keep-alive timeout closes the connection if no request starts at all.
            self._arm_deadline(self.timeout_keep_alive + self.header_timeout_s)

    def _arm_deadline(self, seconds: float) -> None:
        self._stop_deadline()
        self._header_deadline = self.loop.call_later(seconds, self._cut, "header_timeout")

    def _stop_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _cut(self, reason: str) -> None:
        self._stop_deadline()
        if not self.transport.is_closing():
            metrics.CONNECTIONS_CUT.labels(reason).inc()
            self.transport.close()
