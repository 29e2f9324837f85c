"""A 20,000-line batch through the official `openai` client, with online requests answered while it runs."""

from __future__ import annotations

import io
import json
import time

import httpx
import numpy as np
import openai
import pytest

from tests.jobs.helpers import check_job_output, short_lines, wait_final

LINES = 20_000


@pytest.fixture(scope="module")
def server(small_jobs_cluster, tmp_path_factory):
    """A frontend of its own (its own data directory, the default line limit) on the shared cluster."""
    process, url = small_jobs_cluster.extra_frontend(["--data-dir", str(tmp_path_factory.mktemp("scale-data"))])
    yield url
    process.signal(15)
    process.wait(10)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def running_job(client):
    uploaded = client.files.create(file=("big.jsonl", io.BytesIO("\n".join(short_lines(LINES)).encode())),
                                   purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    end = time.monotonic() + 120
    while client.batches.retrieve(batch.id).request_counts.completed == 0:
        assert time.monotonic() < end, "the batch did not start"
        time.sleep(0.1)
    return batch.id


def test_online_requests_are_answered_while_the_job_runs(server, client, running_job):
    texts = [f"an online question {i} about nearest neighbours" for i in range(20)]
    answered = []
    for text in texts:
        response = httpx.post(server + "/v1/embeddings", json={"input": text}, timeout=60)
        assert response.status_code == 200, response.text
        answered.append(np.asarray(response.json()["data"][0]["embedding"], dtype=np.float32))
    progress = client.batches.retrieve(running_job)
    # answered one after another while the job had most of its lines still to do: not queued behind it
    assert progress.status == "in_progress" and progress.request_counts.completed < LINES, progress
    together = httpx.post(server + "/v1/embeddings", json={"input": texts}, timeout=60).json()["data"]
    for alone, item in zip(answered, together):
        want = np.asarray(item["embedding"], dtype=np.float32)
        assert float(alone @ want / np.linalg.norm(alone) / np.linalg.norm(want)) >= 0.9999


def test_the_job_gives_every_custom_id_once_with_the_online_vectors(server, client, running_job):
    batch = wait_final(client, running_job, timeout=600)
    assert batch.status == "completed", batch
    assert (batch.request_counts.total, batch.request_counts.completed, batch.request_counts.failed) == (LINES, LINES, 0)
    assert batch.error_file_id is None
    outputs = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
    check_job_output(server, outputs, LINES)


def test_a_request_may_ask_for_background_priority_and_nothing_else(server):
    text = {"input": "a request that can wait for online ones"}
    online = httpx.post(server + "/v1/embeddings", json=text, timeout=60)
    background = httpx.post(server + "/v1/embeddings", json=text, headers={"X-Quiver-Priority": "background"},
                            timeout=60)
    assert online.status_code == background.status_code == 200, background.text
    a, b = (np.asarray(r.json()["data"][0]["embedding"]) for r in (online, background))
    assert float(a @ b / np.linalg.norm(a) / np.linalg.norm(b)) >= 0.9999
    refused = httpx.post(server + "/v1/embeddings", json=text, headers={"X-Quiver-Priority": "urgent"}, timeout=60)
    assert refused.status_code == 400 and "X-Quiver-Priority" in refused.json()["error"]["message"]
    metrics = httpx.get(server + "/metrics").text
    assert 'quiver_request_failures_total{reason="invalid_request",route="/v1/embeddings"}' in metrics
