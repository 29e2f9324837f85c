"""Scorers: vLLM's /score and /v1/score with each of its field names and
use_activation; /v2/rerank for vLLM and Cohere's v2 client; rerank usage with prompt_tokens; documents
in the results as each peer's default; TEI's POST / reranks for a one-label cross-encoder."""

from __future__ import annotations

import cohere
import httpx
import numpy as np
import pytest

from tests.cluster import Cluster
from tests.e2e.test_scoring import DOCUMENTS, QUERY, hf_pair_logits, minilm_cross_encoder, sigmoid

ATOL = 1e-4


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    path = minilm_cross_encoder(tmp_path_factory.mktemp("cross-encoder"))
    with Cluster(workers=1, model=str(path)) as instance:
        instance.path = path
        yield instance


@pytest.fixture(scope="module")
def logits(cross_encoder) -> np.ndarray:
    """transformers' logits of (QUERY, document) for each of DOCUMENTS: the reference."""
    return hf_pair_logits(cross_encoder.path, [QUERY] * len(DOCUMENTS), DOCUMENTS, 512)[:, 0]


def post(cluster: Cluster, path: str, body: dict) -> dict:
    response = httpx.post(cluster.url + path, json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
@pytest.mark.parametrize("first,second", [("text_1", "text_2"), ("queries", "documents"), ("queries", "items"),
                                          ("data_1", "data_2")])
def test_vllm_score_field_names(cross_encoder, logits, path, first, second):
    body = post(cross_encoder, path, {first: QUERY, second: DOCUMENTS, "model": "any"})
    np.testing.assert_allclose([d["score"] for d in body["data"]], sigmoid(logits), atol=ATOL)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0


def test_use_activation_false_answers_the_logits(cross_encoder, logits):
    raw = post(cross_encoder, "/v1/score", {"queries": QUERY, "documents": DOCUMENTS, "use_activation": False})
    np.testing.assert_allclose([d["score"] for d in raw["data"]], logits, atol=ATOL)
    activated = post(cross_encoder, "/v1/score", {"queries": QUERY, "documents": DOCUMENTS, "use_activation": True})
    np.testing.assert_allclose([d["score"] for d in activated["data"]], sigmoid(logits), atol=ATOL)


def test_rerank_documents_and_usage_as_each_peer(cross_encoder, logits):
    request = {"query": QUERY, "documents": DOCUMENTS, "top_n": 3}
    best = np.argsort(-logits, kind="stable")[:3].tolist()
    cohere_v1 = post(cross_encoder, "/v1/rerank", request)
    vllm = post(cross_encoder, "/v2/rerank", request)
    for body in (cohere_v1, vllm):
        assert [r["index"] for r in body["results"]] == best
        np.testing.assert_allclose([r["relevance_score"] for r in body["results"]], sigmoid(logits[best]), atol=ATOL)
        assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0
    assert all("document" not in r for r in cohere_v1["results"])  # Cohere's default
    assert [r["document"]["text"] for r in vllm["results"]] == [DOCUMENTS[i] for i in best]  # vLLM's
    asked = post(cross_encoder, "/v1/rerank", {**request, "return_documents": True})
    assert [r["document"]["text"] for r in asked["results"]] == [DOCUMENTS[i] for i in best]
    declined = post(cross_encoder, "/v2/rerank", {**request, "return_documents": False})
    assert all("document" not in r for r in declined["results"])


def test_cohere_v2_client_reranks(cross_encoder, logits):
    client = cohere.ClientV2(api_key="unused", base_url=cross_encoder.url, timeout=60)
    response = client.rerank(model="rerank-v3.5", query=QUERY, documents=DOCUMENTS, top_n=4)
    best = np.argsort(-logits, kind="stable")[:4].tolist()
    assert [r.index for r in response.results] == best
    np.testing.assert_allclose([r.relevance_score for r in response.results], sigmoid(logits[best]), atol=ATOL)


@pytest.mark.parametrize("path", ["/", "/invocations"])
def test_tei_root_reranks_for_a_one_label_cross_encoder(cross_encoder, logits, path):
    ranks = post(cross_encoder, path, {"query": QUERY, "texts": DOCUMENTS})
    assert [r["index"] for r in ranks] == np.argsort(-logits, kind="stable").tolist()
    np.testing.assert_allclose([r["score"] for r in sorted(ranks, key=lambda r: r["index"])], sigmoid(logits),
                               atol=ATOL)
