"""The in-flight check comes before the body is read, parsed or tokenized,
estimated from the body's declared size; the exact token count still settles it afterwards."""

from __future__ import annotations

import socket
import threading
import time

import httpx

from tests.corpus import sentences


def test_429_before_the_body_is_sent(cluster):
    _, url = cluster.extra_frontend(["--max-inflight-tokens", "1000"])
    results: dict[str, httpx.Response] = {}

    def big() -> None:
        results["big"] = httpx.post(url + "/embed", json={"inputs": sentences(400)}, timeout=300)

    thread = threading.Thread(target=big)
    thread.start()
    time.sleep(0.5)  # the big request (about ten thousand tokens) is in flight
    host, port = url.removeprefix("http://").split(":")
    try:
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            # Eight megabytes announced, none sent: the answer must not wait for them.
            sock.sendall(b"POST /embed HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 8000000\r\n\r\n")
            sock.settimeout(30)
            answer = b""
            while b"Overloaded" not in answer:  # the head and the JSON body may come in two packets
                part = sock.recv(65536)
                if not part:
                    break
                answer += part
    finally:
        thread.join()
    assert answer.startswith(b"HTTP/1.1 429"), answer[:300]
    assert b"retry-after: 1" in answer.lower()
    assert b"Overloaded" in answer
    assert results["big"].status_code == 200
    # With nothing in flight any request is admitted, and its exact count settles the reservation.
    after = httpx.post(url + "/embed", json={"inputs": sentences(50)}, timeout=120)
    assert after.status_code == 200
    assert httpx.get(url + "/metrics", timeout=10).text.count("quiver_frontend_inflight_tokens 0.0") == 1
