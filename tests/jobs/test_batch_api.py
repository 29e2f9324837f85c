"""The OpenAI Batch API of a real cluster, driven by the official `openai` client."""

from __future__ import annotations

import io
import json

import httpx
import numpy as np
import openai
import pytest

from tests.jobs.helpers import embedding_lines, wait_final

LINES = 400


@pytest.fixture(scope="module")
def server(jobs_cluster):
    return jobs_cluster


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _upload(client, lines: list[str]):
    return client.files.create(file=("requests.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch")


def test_a_job_gives_every_custom_id_once_with_the_online_vectors(server, client):
    lines = embedding_lines(LINES)
    lines.insert(10, "{this is not json")
    lines.insert(20, json.dumps({"custom_id": "r3", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}}))
    lines.insert(30, json.dumps({"custom_id": "empty", "method": "POST", "url": "/v1/embeddings", "body": {"input": ""}}))
    uploaded = _upload(client, lines)
    assert uploaded.purpose == "batch" and uploaded.bytes == len("\n".join(lines).encode())
    assert client.files.retrieve(uploaded.id).filename == "requests.jsonl"
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h",
                                  metadata={"job": "test"})
    assert batch.status == "validating" and batch.metadata == {"job": "test"}
    batch = wait_final(client, batch.id)
    assert batch.status == "completed", batch
    assert batch.request_counts.total == LINES + 3
    assert (batch.request_counts.completed, batch.request_counts.failed) == (LINES, 3)
    assert batch.in_progress_at and batch.finalizing_at and batch.completed_at

    outputs = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
    ids = [o["custom_id"] for o in outputs]
    assert ids == [f"r{i}" for i in range(LINES)]  # each once, in input order
    errors = [json.loads(line) for line in client.files.content(batch.error_file_id).text.splitlines()]
    assert [e["custom_id"] for e in errors] == [None, "r3", "empty"]
    assert errors[0]["error"]["code"] == "invalid_json"
    assert errors[1]["error"]["code"] == "duplicate_custom_id"
    assert errors[2]["response"]["status_code"] == 400
    assert errors[2]["response"]["body"]["error"]["code"] == "empty_input"

    sample = list(range(0, LINES, 37))
    texts, where = [], []
    for i in sample:
        body = json.loads(embedding_lines(LINES)[i])["body"]
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        for k, text in enumerate(inputs):
            texts.append(text)
            where.append((i, k))
    online = client.embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", input=texts)
    for (i, k), item in zip(where, online.data):
        response = outputs[i]["response"]
        assert response["status_code"] == 200
        got = np.asarray(response["body"]["data"][k]["embedding"])
        want = np.asarray(item.embedding)
        assert float(got @ want / np.linalg.norm(got) / np.linalg.norm(want)) >= 0.9999
    assert outputs[0]["response"]["body"]["usage"]["prompt_tokens"] > 0
    metrics = httpx.get(server.url + "/metrics").text
    for reason in ("invalid_json", "duplicate_custom_id", "empty_input"):
        assert f'quiver_request_failures_total{{reason="{reason}",route="batch"}} 1.0' in metrics


def test_limits_and_refusals_come_in_openai_format(server, client):
    with pytest.raises(openai.BadRequestError, match="more than 1000 lines"):
        _upload(client, embedding_lines(1001))
    with pytest.raises(openai.APIStatusError) as too_big:
        _upload(client, ["x" * 1000] * 401)
    assert too_big.value.status_code == 413
    with pytest.raises(openai.BadRequestError, match="purpose"):
        client.files.create(file=("a.jsonl", io.BytesIO(b"{}")), purpose="fine-tune")
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-missing", endpoint="/v1/embeddings", completion_window="24h")
    uploaded = _upload(client, embedding_lines(3))
    with pytest.raises(openai.BadRequestError, match="scoring model"):
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/rerank", completion_window="24h")  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="soon")  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch-nope")
    response = httpx.post(server.url + "/v1/files", content=b"not a form", headers={"content-type": "text/plain"})
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"
    broken = httpx.post(server.url + "/v1/files", content=b"--x\r\nbroken",
                        headers={"content-type": "multipart/form-data; boundary=x"})
    assert broken.status_code == 400, broken.text
    assert client.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.content(uploaded.id)
    assert server.health().status_code == 200


def test_cancel_list_and_pages(server, client):
    uploaded = _upload(client, embedding_lines(900, prefix="c"))
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status in ("cancelling", "cancelled")
    batch = wait_final(client, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at
    done = batch.request_counts.completed
    assert done < 900
    output = client.files.content(batch.output_file_id).text.splitlines()
    assert len(output) == done
    with pytest.raises(openai.BadRequestError, match="cannot be cancelled"):
        client.batches.cancel(batch.id)

    small = _upload(client, embedding_lines(2, prefix="s"))
    made = [client.batches.create(input_file_id=small.id, endpoint="/v1/embeddings", completion_window="1h").id
            for _ in range(3)]
    first = client.batches.list(limit=2)
    assert [b.id for b in first.data] == made[::-1][:2] and first.has_more
    rest = client.batches.list(limit=2, after=first.data[-1].id)
    assert rest.data[0].id == made[0]
    for batch_id in made:
        assert wait_final(client, batch_id).status == "completed"


def test_an_unusable_data_directory_turns_off_only_the_batch_routes(server, tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the data directory should be")
    process, url = server.extra_frontend(["--data-dir", str(blocker)])
    try:
        refused = httpx.get(url + "/v1/batches")
        assert refused.status_code == 503 and "data directory" in refused.json()["error"]["message"]
        assert httpx.post(url + "/v1/embeddings", json={"input": "still serving"}).status_code == 200
    finally:
        process.signal(15)
        process.wait(10)
