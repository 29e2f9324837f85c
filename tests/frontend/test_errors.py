"""Every error case the frontend answers, over HTTP against real processes: status, body, and the
server still healthy afterwards."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.corpus import sentences
from tests.cluster import Cluster


def assert_still_healthy(url: str) -> None:
    assert httpx.get(url + "/health", timeout=5).status_code == 200
    ok = httpx.post(url + "/embed", json={"inputs": "still serving"}, timeout=30)
    assert ok.status_code == 200 and len(ok.json()[0]) == 384


def openai_error(response: httpx.Response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"] and error["type"]
    return error


def tei_error(response: httpx.Response, status: int, error_type: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["error_type"] == error_type and body["error"]
    return body


CASES = [
    # (route, body, status, code or error_type, words the message must hold)
    ("/v1/embeddings", {"input": ""}, 400, "empty_input", "empty"),
    ("/v1/embeddings", {"input": []}, 400, "empty_input", "empty"),
    ("/v1/embeddings", {"input": [[]]}, 400, "empty_input", "empty"),
    ("/v1/embeddings", {"input": [1, 2, 30522]}, 422, "token_out_of_vocabulary", "30522"),
    ("/v1/embeddings", {"input": [-1]}, 422, "token_out_of_vocabulary", "vocabulary"),
    # Over-long input: 400 on OpenAI-style routes, as OpenAI and vLLM answer.
    ("/v1/embeddings", {"input": "word " * 400}, 400, "input_too_long", "256"),
    ("/v1/embeddings", {"input": [5] * 300}, 400, "input_too_long", "256"),
    ("/v1/embeddings", {"input": ["x"] * 2049}, 413, "too_many_inputs", "2048"),
    ("/v1/embeddings", {"input": 12}, 400, "invalid_request", "input"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "int4"}, 400, "invalid_request", "encoding_format"),
    ("/v1/embeddings", {"input": "x", "dimensions": 385}, 400, "invalid_request", "384"),
    ("/v1/embeddings", {"input": "x", "dimensions": 0}, 400, "invalid_request", "dimensions"),
    ("/embed", {"inputs": ""}, 400, "Empty", "empty"),
    ("/embed", {"inputs": []}, 400, "Empty", "empty"),
    ("/embed", {"inputs": "word " * 400}, 422, "Validation", "256"),
    ("/embed", {"inputs": "x", "prompt_name": "query"}, 422, "Validation", "prompt_name"),
    ("/embed", {"inputs": {"text": "x"}}, 422, "Validation", "inputs"),
    ("/embed", {"normalize": True}, 422, "Validation", "inputs"),
    ("/embed", {"inputs": "x", "truncation_direction": "middle"}, 422, "Validation", "truncation_direction"),
    ("/tokenize", {"inputs": ""}, 400, "Empty", "empty"),
]


@pytest.mark.parametrize("route,body,status,code,words", CASES)
def test_bad_input_gets_its_error(cluster, route, body, status, code, words):
    response = httpx.post(cluster.url + route, json=body, timeout=30)
    if route.startswith("/v1/"):
        message = openai_error(response, status, code)["message"]
    else:
        message = tei_error(response, status, code)["error"]
    assert words.lower() in message.lower(), message


def test_truncation_instead_of_an_error(cluster):
    long_text = "word " * 400
    for direction in ("right", "left"):
        response = httpx.post(cluster.url + "/embed", json={"inputs": long_text, "truncate": True,
                                                            "truncation_direction": direction}, timeout=30)
        assert response.status_code == 200
    openai = httpx.post(cluster.url + "/v1/embeddings", json={"input": [7] * 300, "truncate": True}, timeout=30)
    assert openai.status_code == 200
    assert openai.json()["usage"]["prompt_tokens"] == 256


def test_malformed_json_and_unknown_routes(cluster):
    bad = httpx.post(cluster.url + "/v1/embeddings", content=b"{not json", timeout=10)
    openai_error(bad, 400, "bad_json")
    tei_error(httpx.post(cluster.url + "/embed", content=b"[1,", timeout=10), 400, "Validation")
    tei_error(httpx.get(cluster.url + "/nope", timeout=10), 404, "NotFound")
    tei_error(httpx.get(cluster.url + "/embed", timeout=10), 405, "NotFound")
    assert_still_healthy(cluster.url)


def test_body_over_the_limit_is_413(cluster):
    big = {"inputs": ["x" * 1000] * 5000}  # about 5 MB, over the 4 MiB the test cluster allows
    tei_error(httpx.post(cluster.url + "/embed", json=big, timeout=30), 413, "Validation")
    assert_still_healthy(cluster.url)


def test_errors_leave_the_server_healthy(cluster):
    for route, body, *_ in CASES:
        httpx.post(cluster.url + route, json=body, timeout=30)
    assert_still_healthy(cluster.url)


def test_api_key(cluster):
    _, url = cluster.extra_frontend(["--api-key", "s3cret"])
    openai_error(httpx.post(url + "/v1/embeddings", json={"input": "x"}, timeout=10), 401, "unauthorized")
    wrong = httpx.post(url + "/embed", json={"inputs": "x"}, headers={"Authorization": "Bearer nope"}, timeout=10)
    tei_error(wrong, 401, "Unauthorized")
    right = httpx.post(url + "/embed", json={"inputs": "x"}, headers={"Authorization": "Bearer s3cret"}, timeout=10)
    assert right.status_code == 200
    assert httpx.get(url + "/health", timeout=10).status_code == 200  # probes need no key


def test_inflight_token_cap_answers_429_with_retry_after(cluster):
    _, url = cluster.extra_frontend(["--max-inflight-tokens", "100"])
    texts = sentences(400)
    results: dict[str, httpx.Response] = {}

    def big() -> None:
        results["big"] = httpx.post(url + "/embed", json={"inputs": texts}, timeout=300)

    thread = threading.Thread(target=big)
    thread.start()
    time.sleep(0.5)  # the big request (about ten thousand tokens, seconds of CPU work) is now in flight
    second = httpx.post(url + "/embed", json={"inputs": "one more"}, timeout=30)
    thread.join()
    body = tei_error(second, 429, "Overloaded")
    assert "100" in body["error"]
    assert int(second.headers["retry-after"]) >= 1
    assert results["big"].status_code == 200
    assert httpx.post(url + "/embed", json={"inputs": "after the load"}, timeout=30).status_code == 200


def test_deadline_answers_504_and_the_server_recovers(cluster):
    _, url = cluster.extra_frontend(["--request-timeout-s", "0.3"])
    texts = [t * 8 for t in sentences(2000)]  # far more work than 0.3 s of two CPU workers
    response = httpx.post(url + "/embed", json={"inputs": texts, "truncate": True}, timeout=60)
    tei_error(response, 504, "Backend")
    # Its cancelled chunks must not hold the workers up for long.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if httpx.post(url + "/embed", json={"inputs": "quick"}, timeout=30).status_code == 200:
            break
    assert_still_healthy(cluster.url)


def test_no_live_worker_is_503():
    with Cluster(workers=0) as no_workers:
        url = no_workers.url
        health = httpx.get(url + "/health", timeout=5)
        assert health.status_code == 503
        response = httpx.post(url + "/v1/embeddings", json={"input": "x"}, timeout=10)
        openai_error(response, 503, "unavailable")
        assert response.headers["retry-after"] == "1"
