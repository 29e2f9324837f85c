"""SPLADE over HTTP by real processes: TEI's /embed_sparse on naver/splade-v3's layout (tiny, random weights),
against transformers' BertForMaskedLM on the same checkpoint (log(1 + relu(logits)), max over tokens).

Two workers and chunks of two inputs, so that one request's rows come back from several sparse
results and are put back in order.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.cluster import Cluster
from tests.worker.engine.published import TEXTS, splade, splade_reference


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return splade(tmp_path_factory.mktemp("splade"))


@pytest.fixture(scope="module")
def server(checkpoint: Path):
    with Cluster(workers=2, model=str(checkpoint), frontend_args=["--max-chunk-seqs", "2"]) as cluster:
        yield cluster


def test_sparse_weights_match_transformers(server: Cluster, checkpoint: Path) -> None:
    response = httpx.post(server.url + "/embed_sparse", json={"inputs": TEXTS}, timeout=60)
    assert response.status_code == 200, response.text
    body = response.json()
    expected = splade_reference(checkpoint, TEXTS)
    assert len(body) == len(TEXTS)
    for row, want in zip(body, expected):
        indices = [item["index"] for item in row]
        assert indices == sorted(indices) and len(set(indices)) == len(indices)
        assert all(item["value"] > 0 for item in row)
        dense = np.zeros_like(want)
        dense[indices] = [item["value"] for item in row]
        np.testing.assert_allclose(dense, want, atol=1e-4, rtol=0)
        assert 0 < len(row) < len(want)  # sparse: some entries are zero


def test_single_input_equals_its_row_in_a_batch(server: Cluster) -> None:
    one = httpx.post(server.url + "/embed_sparse", json={"inputs": TEXTS[2]}, timeout=30).json()
    batch = httpx.post(server.url + "/embed_sparse", json={"inputs": TEXTS}, timeout=30).json()
    assert len(one) == 1

    def dense(row: list[dict]) -> np.ndarray:
        out = np.zeros(1 + max(item["index"] for item in one[0] + row))
        out[[item["index"] for item in row]] = [item["value"] for item in row]
        return out

    np.testing.assert_allclose(dense(one[0]), dense(batch[2]), atol=1e-5)  # batching changes rounding only


def test_dense_routes_name_what_the_model_serves(server: Cluster) -> None:
    response = httpx.post(server.url + "/embed", json={"inputs": "x"}, timeout=30)
    assert response.status_code == 424  # TEI answers a route its model cannot serve with 424
    assert "sparse" in response.json()["error"] and "which serves /embed_sparse" in response.json()["error"]
    info = httpx.get(server.url + "/info", timeout=10).json()
    assert info["model_kind"] == "sparse" and info["pooling"] == "splade"
    assert "/embed_sparse" in httpx.get(server.url + "/openapi.json", timeout=10).json()["paths"]


def test_sparse_route_on_a_dense_model(cluster) -> None:
    response = httpx.post(cluster.url + "/embed_sparse", json={"inputs": "x"}, timeout=30)
    assert response.status_code == 424
    message = response.json()["error"]
    assert "sparse model" in message and "/v1/embeddings" in message
