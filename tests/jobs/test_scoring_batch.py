"""Batches of /v1/rerank and /score lines on a cross-encoder give the scores the online routes give."""

from __future__ import annotations

import io
import json

import httpx
import openai
import pytest

from tests.cluster import Cluster
from tests.e2e.test_scoring import minilm_cross_encoder
from tests.jobs.helpers import wait_final

QUERY = "how do vector databases index embeddings"
DOCUMENTS = ["HNSW graphs link each vector to its near neighbours.", "Bread rises because of yeast.",
             "Product quantisation compresses vectors into short codes.", ""]


@pytest.fixture(scope="module")
def scorer(tmp_path_factory):
    cluster = Cluster(workers=1, model=str(minilm_cross_encoder(tmp_path_factory.mktemp("scorer"))))
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.mark.parametrize("endpoint, body", [
    ("/v1/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": 3}),
    ("/score", {"text_1": QUERY, "text_2": DOCUMENTS}),
])
def test_scoring_lines_match_the_online_route(scorer, endpoint, body):
    client = openai.OpenAI(base_url=scorer.url + "/v1", api_key="unused", max_retries=0)
    lines = [json.dumps({"custom_id": f"q{i}", "method": "POST", "url": endpoint, "body": body}) for i in range(3)]
    lines.append(json.dumps({"custom_id": "bad", "method": "POST", "url": endpoint, "body": {"query": 5}}))
    uploaded = client.files.create(file=("s.jsonl", io.BytesIO("\n".join(lines).encode())), purpose="batch")
    batch = wait_final(client, client.batches.create(input_file_id=uploaded.id, endpoint=endpoint,  # type: ignore[arg-type]
                                                     completion_window="24h").id)
    assert batch.status == "completed" and (batch.request_counts.completed, batch.request_counts.failed) == (3, 1)
    online = httpx.post(scorer.url + endpoint, json=body, timeout=60).json()
    for line in client.files.content(batch.output_file_id).text.splitlines():
        answer = json.loads(line)["response"]["body"]
        if endpoint == "/v1/rerank":
            assert [r["index"] for r in answer["results"]] == [r["index"] for r in online["results"]]
            assert [r["relevance_score"] for r in answer["results"]] == pytest.approx(
                [r["relevance_score"] for r in online["results"]], abs=1e-5)
        else:
            assert [d["score"] for d in answer["data"]] == pytest.approx([d["score"] for d in online["data"]], abs=1e-5)
    error = json.loads(client.files.content(batch.error_file_id).text)
    assert error["custom_id"] == "bad" and error["response"]["status_code"] == 400
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
