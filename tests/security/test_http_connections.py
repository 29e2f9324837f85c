"""Slowloris headers, slow bodies, idle and surplus connections are cut, with real
raw sockets against a real frontend; the limits show in /info and the server keeps serving."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from tests.security.test_http_client_mistakes import counter

LIMITS = ["--header-timeout-s", "1", "--body-timeout-s", "1", "--keep-alive-timeout-s", "1",
          "--max-connections", "8", "--max-header-bytes", "4096"]
CUT_WITHIN_S = 15.0  # generous: the limits are 1 s, the machine is shared


@pytest.fixture(scope="module")
def guarded(cluster):
    _, url = cluster.extra_frontend(LIMITS)
    return url


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=CUT_WITHIN_S)
    return sock


def read_until_closed(sock: socket.socket, keep_sending: bytes = b"", every_s: float = 0.2) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and how long that took; while
    waiting, send `keep_sending` one byte at a time (a slowloris). Fails if it stays open."""
    started = time.monotonic()
    received = b""
    sock.settimeout(every_s)
    position = 0
    while time.monotonic() - started < CUT_WITHIN_S:
        if position < len(keep_sending):
            try:
                sock.sendall(keep_sending[position:position + 1])
            except OSError:
                return received, time.monotonic() - started
            position += 1
        try:
            part = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return received, time.monotonic() - started
        if not part:
            return received, time.monotonic() - started
        received += part
    pytest.fail(f"the server kept the connection open for {CUT_WITHIN_S} s; received {received[:200]!r}")


def test_limits_are_in_info(guarded):
    limits = httpx.get(guarded + "/info", timeout=10).json()["limits"]
    assert limits["header_timeout_s"] == 1 and limits["body_timeout_s"] == 1
    assert limits["keep_alive_timeout_s"] == 1 and limits["max_connections"] == 8
    assert limits["max_header_bytes"] == 4096


def test_slowloris_headers_are_cut(guarded):
    with connect(guarded) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
        endless = b"".join(b"X-Slow-%d: 1\r\n" % i for i in range(2000))
        received, _ = read_until_closed(sock, keep_sending=endless)
    assert b"200 OK" not in received


def test_a_connection_that_sends_nothing_is_cut(guarded):
    with connect(guarded) as sock:
        received, _ = read_until_closed(sock)
    assert received == b""


def test_a_slow_body_gets_408_and_is_cut(guarded):
    with connect(guarded) as sock:
        sock.sendall(b"POST /embed HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"inputs\": \"")
        received, _ = read_until_closed(sock)
    assert received.startswith(b"HTTP/1.1 408"), received[:200]
    assert b'"error_type":"Validation"' in received


def test_an_idle_keep_alive_connection_is_cut(guarded):
    with connect(guarded) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        received, _ = read_until_closed(sock)
    assert received.startswith(b"HTTP/1.1 200")


def test_oversized_headers_get_431(guarded):
    with connect(guarded) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + b"a" * 8000 + b"\r\n\r\n")
        received, _ = read_until_closed(sock)
    assert received.startswith(b"HTTP/1.1 431"), received[:200]


def test_connections_over_the_cap_are_closed_and_the_server_serves_on(guarded):
    held = [connect(guarded) for _ in range(8)]
    try:
        time.sleep(0.5)
        with connect(guarded) as extra:
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
            received, _ = read_until_closed(extra)
        assert b"200 OK" not in received
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + CUT_WITHIN_S
    while time.monotonic() < deadline:  # the held sockets' closing reaches the server
        try:
            if httpx.get(guarded + "/health", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    else:
        pytest.fail("the server did not serve again once the connections were closed")


def test_every_cut_is_counted(guarded):
    """After the tests above (run in file order), each reason has been counted at least once."""
    metrics = httpx.get(guarded + "/metrics", timeout=10).text
    for reason in ("header_timeout", "header_too_large", "too_many_connections"):
        assert counter(metrics, "quiver_frontend_connections_cut_total", reason=reason) >= 1, reason
