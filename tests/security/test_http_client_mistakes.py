"""No 500 for a client's mistake. Token ids beyond int64 get the API's own 422, and
a client that leaves in the middle of its body is counted as client_disconnected, with no traceback."""

from __future__ import annotations

import socket
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.frontend.test_errors import openai_error, tei_error


def counter(metrics_text: str, name: str, **labels: str) -> float:
    """The value of the sample `name` with exactly these labels in a /metrics text; 0 when absent."""
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


@pytest.mark.parametrize("token_id", [2**63, 2**64 - 1, 2**63 + 12345])
def test_token_ids_beyond_int64_are_out_of_vocabulary(cluster, token_id):
    response = httpx.post(cluster.url + "/v1/embeddings", json={"input": [1, 2, token_id]}, timeout=30)
    error = openai_error(response, 422, "token_out_of_vocabulary")
    assert str(token_id) in error["message"]
    nested = httpx.post(cluster.url + "/embed", json={"inputs": [[5, 6], [token_id]]}, timeout=30)
    assert str(token_id) in tei_error(nested, 422, "Validation")["error"]


def test_a_client_that_leaves_mid_body_is_counted_not_a_500(cluster):
    proc, url = cluster.extra_frontend([])
    host, port = url.removeprefix("http://").split(":")
    for _ in range(3):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(b"POST /embed HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 5000\r\n\r\n{\"inputs\": [\"half a bo")
            time.sleep(0.3)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        metrics = httpx.get(url + "/metrics", timeout=10).text
        if counter(metrics, "quiver_request_failures_total", route="/embed", reason="client_disconnected") >= 3:
            break
        time.sleep(0.2)
    else:
        pytest.fail("the disconnects were not counted as client_disconnected:\n" + proc.log()[-3000:])
    assert counter(metrics, "quiver_requests_total", route="/embed", status="500") == 0
    assert counter(metrics, "quiver_request_failures_total", route="/embed", reason="internal") == 0
    assert "Traceback" not in proc.log()
    assert httpx.post(url + "/embed", json={"inputs": "still here"}, timeout=30).status_code == 200
