"""Text Embeddings Inference's POST / and POST /invocations, dispatched by the
model's kind as TEI does; huggingface_hub's InferenceClient(base_url=...) works unchanged; a route the
model cannot serve is TEI's 424."""

from __future__ import annotations

import httpx
import huggingface_hub.constants
import numpy as np
import pytest
from huggingface_hub import InferenceClient

from tests.cluster import Cluster
from tests.e2e.test_scoring import xlmr_classifier
from tests.frontend.test_errors import tei_error

TEXTS = ["a cat sleeps on the sofa", "the stock market fell", "rain all week"]


def test_inference_client_feature_extraction(cluster, st_model, monkeypatch):
    # The suite runs with HF_HUB_OFFLINE=1, which makes huggingface_hub refuse every request, even to
    # a local base_url; this client talks to the test's own server only.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    served = InferenceClient(base_url=cluster.url).feature_extraction(TEXTS[0])
    expected = st_model.encode([TEXTS[0]], normalize_embeddings=True)
    np.testing.assert_allclose(np.asarray(served).reshape(1, -1), expected, atol=1e-4)


@pytest.mark.parametrize("path", ["/", "/invocations"])
def test_root_and_invocations_embed_for_an_embedder(cluster, path):
    body = {"inputs": TEXTS, "normalize": False}
    root = httpx.post(cluster.url + path, json=body, timeout=30)
    embed = httpx.post(cluster.url + "/embed", json=body, timeout=30)
    assert root.status_code == 200, root.text
    np.testing.assert_allclose(root.json(), embed.json(), atol=1e-5)
    tei_error(httpx.post(cluster.url + path, json={"query": "q", "texts": ["a"]}, timeout=30), 422, "Validation")


@pytest.mark.parametrize("path,body", [("/rerank", {"query": "q", "texts": ["a"]}), ("/predict", {"inputs": "a"})])
def test_a_route_the_embedder_cannot_serve_is_424(cluster, path, body):
    assert "embedding model" in tei_error(httpx.post(cluster.url + path, json=body, timeout=30), 424, "Backend")["error"]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    with Cluster(workers=1, model=str(xlmr_classifier(tmp_path_factory.mktemp("classifier")))) as instance:
        yield instance


@pytest.mark.parametrize("path", ["/", "/invocations"])
def test_root_predicts_for_a_classifier(classifier, path):
    body = {"inputs": [["how do cats sleep", "on the sofa"], ["rain"], ["all week"]]}
    root = httpx.post(classifier.url + path, json=body, timeout=30)
    predict = httpx.post(classifier.url + "/predict", json=body, timeout=30)
    assert root.status_code == 200, root.text
    assert len(root.json()) == 3
    for got, want in zip(root.json(), predict.json()):
        assert [p["label"] for p in got] == [p["label"] for p in want]
        np.testing.assert_allclose([p["score"] for p in got], [p["score"] for p in want], atol=1e-5)
    tei_error(httpx.post(classifier.url + "/embed", json={"inputs": "x"}, timeout=30), 424, "Backend")
