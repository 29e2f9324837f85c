"""A huge /tokenize runs off the event loop (health stays 200 while it runs) and its
answer is bounded (413 past --max-tokenize-tokens) instead of multiplying the body's memory."""

from __future__ import annotations

import threading
import time

import httpx
from transformers import AutoTokenizer

from quiver.common.model_info import default_model_dir

from tests.frontend.test_errors import tei_error


def test_a_huge_tokenize_leaves_health_answering_and_is_bounded(cluster):
    # A 3 s liveness window (1 s heartbeats) so that a shared, busy test machine starving the broker for a
    # moment is not read as a stalled event loop; the stall this guards against lasted 7–16 s.
    _, url = cluster.extra_frontend(["--max-body-bytes", str(32 * 1024 * 1024), "--heartbeat-interval-s", "1"])
    word = "tokenization "
    texts = [word * 600] * 2048  # 16 MB of text, about 3 million tokens
    results: dict[str, httpx.Response] = {}

    def huge() -> None:
        results["huge"] = httpx.post(url + "/tokenize", json={"inputs": texts}, timeout=600)

    thread = threading.Thread(target=huge)
    thread.start()
    statuses = []
    while thread.is_alive():
        try:
            statuses.append(httpx.get(url + "/health", timeout=5).status_code)
        except httpx.TimeoutException:
            statuses.append("timeout")
        time.sleep(0.1)
    thread.join()
    assert statuses and all(status == 200 for status in statuses), [s for s in statuses if s != 200]
    body = tei_error(results["huge"], 413, "Validation")
    assert "262144" in body["error"]


def test_tokenize_within_the_limit_answers_every_token(cluster):
    _, url = cluster.extra_frontend(["--max-tokenize-tokens", "50"])
    info = httpx.get(url + "/info", timeout=10).json()
    assert info["limits"]["max_tokenize_tokens"] == 50
    fits = httpx.post(url + "/tokenize", json={"inputs": ["hello world"] * 12}, timeout=30)  # 48 tokens
    assert fits.status_code == 200
    expected = AutoTokenizer.from_pretrained(str(default_model_dir()))("hello world")["input_ids"]
    assert [[token["id"] for token in tokens] for tokens in fits.json()] == [expected] * 12
    over = httpx.post(url + "/tokenize", json={"inputs": ["hello world"] * 13}, timeout=30)
    assert str(13 * len(expected)) in tei_error(over, 413, "Validation")["error"]
