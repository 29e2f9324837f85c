"""A fresh frontend warms its request path through the real broker and worker before /health says 200."""

from __future__ import annotations

import time

import httpx

from tests.cluster import Cluster
from tests.e2e.test_reliability import metric

STEP_MS = 200  # every forward pass of the worker takes this long: the warm-up is slow enough to watch


def test_the_warmup_answers_every_request_before_health_says_200_with_an_api_key_too() -> None:
    with Cluster(workers=1, env={"QUIVER_INJECT_FAULTS": f"step_ms={STEP_MS}"},
                 frontend_args=["--warmup-rounds", "1", "--api-key", "the-key"]) as cluster:
        # Cluster.start returned at the first 200; the worker was live before that, while the warm-up ran.
        log = cluster.frontend.log()
        assert "request path warmed: 9 requests" in log, log
        metrics_url = cluster.url + "/metrics"
        assert metric(metrics_url, "quiver_frontend_warmup_requests_total") == 9
        assert metric(metrics_url, "quiver_requests_total", {"route": "/v1/embeddings", "status": "200"}) == 6
        assert metric(metrics_url, "quiver_requests_total", {"route": "/embed", "status": "200"}) == 3
        assert "warm-up request" not in log, log
        answer = httpx.post(cluster.url + "/embed", json={"inputs": "after the warm-up"},
                            headers={"Authorization": "Bearer the-key"}, timeout=30)
        assert answer.status_code == 200, answer.text


def test_health_says_warming_up_until_the_warmup_is_answered() -> None:
    cluster = Cluster(workers=1, env={"QUIVER_INJECT_FAULTS": f"step_ms={STEP_MS}"},
                      frontend_args=["--warmup-rounds", "1"])
    try:
        cluster.start_broker()
        cluster.start_worker()
        cluster.start_frontend()
        seen: list[tuple[int, str]] = []
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                answer = cluster.health()
            except httpx.HTTPError:
                time.sleep(0.05)
                continue
            seen.append((answer.status_code, answer.text))
            if answer.status_code == 200:
                break
            time.sleep(0.05)
        assert seen and seen[-1][0] == 200, seen[-5:]
        warming = [text for status, text in seen if status == 503 and "warming up" in text]
        # nine requests of STEP_MS each: the 503 lasts well over a second
        assert len(warming) >= 5, seen
    finally:
        cluster.stop()


def test_a_failing_warmup_request_does_not_keep_the_server_unready() -> None:
    # Every forward pass over 40 tokens fails: the warm-up's second request does, and the warm-up ends there.
    with Cluster(workers=1, env={"QUIVER_INJECT_FAULTS": "oom_over_tokens=40"}) as cluster:
        log = cluster.frontend.log()
        assert "warm-up request to /v1/embeddings answered 500" in log, log
        assert metric(cluster.url + "/metrics", "quiver_frontend_warmup_requests_total") == 2
        assert httpx.post(cluster.url + "/embed", json={"inputs": "short"}, timeout=30).status_code == 200


def test_no_warmup_rounds_means_ready_at_once() -> None:
    with Cluster(workers=1, frontend_args=["--warmup-rounds", "0"]) as cluster:
        assert metric(cluster.url + "/metrics", "quiver_frontend_warmup_requests_total") == 0
        assert "request path warmed" not in cluster.frontend.log()
