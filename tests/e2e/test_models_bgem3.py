"""BGE-M3's three outputs over HTTP by real processes, against FlagEmbedding's BGEM3FlagModel.

The checkpoint is BAAI/bge-m3's layout at tiny sizes (tests/worker/engine/published.py): an XLM-RoBERTa
encoder with CLS pooling and Normalize, and the sparse_linear.pt / colbert_linear.pt heads saved as
FlagEmbedding saves them. Two workers and chunks of two inputs, so that one request's token rows come
back from several results and are put back in order. One input holds words the tokenizer does not know
(its unk token, which the sparse output drops).
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.cluster import Cluster
from tests.worker.engine.published import TEXTS, bge_m3, flag_m3_model

INPUTS = [*TEXTS, "zebra quickly the fox"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bge_m3(tmp_path_factory.mktemp("bge-m3"))


@pytest.fixture(scope="module")
def server(checkpoint: Path):
    with Cluster(workers=2, model=str(checkpoint), frontend_args=["--max-chunk-seqs", "2"]) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def reference(checkpoint: Path) -> dict[str, Any]:
    model = flag_m3_model(checkpoint)
    return model.encode(INPUTS, return_dense=True, return_sparse=True, return_colbert_vecs=True)


def _post(server: Cluster, path: str, body: dict[str, Any], status: int = 200) -> Any:
    response = httpx.post(server.url + path, json=body, timeout=60)
    assert response.status_code == status, response.text
    return response.json()


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _assert_sparse_matches(served: list[dict[str, float]], expected: dict[str, float]) -> None:
    indices = [item["index"] for item in served]
    assert indices == sorted(indices) and len(set(indices)) == len(indices)
    got = {item["index"]: item["value"] for item in served}
    want = {int(k): float(v) for k, v in expected.items()}
    for index in set(got) | set(want):
        assert abs(got.get(index, 0.0) - want.get(index, 0.0)) <= 1e-3, (index, got, want)
    assert all(value > 0 for value in got.values())


def test_three_outputs_in_one_response_match_flagembedding(server: Cluster, reference: dict[str, Any]) -> None:
    body = _post(server, "/v1/embeddings", {"input": INPUTS, "outputs": ["dense", "sparse", "colbert"]})
    data = body["data"]
    assert [item["index"] for item in data] == list(range(len(INPUTS)))
    dense = np.array([item["embedding"] for item in data], dtype=np.float32)
    assert _cosines(dense, reference["dense_vecs"]).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(dense, axis=1), 1.0, atol=1e-5)
    for item, want in zip(data, reference["lexical_weights"]):
        _assert_sparse_matches(item["sparse_embedding"], want)
    for item, want in zip(data, reference["colbert_vecs"]):
        vectors = np.array(item["colbert_embedding"], dtype=np.float32)
        assert vectors.shape == want.shape  # every token but CLS
        assert _cosines(vectors, want).min() >= 0.9999
    assert body["usage"]["prompt_tokens"] == sum(len(v) + 1 for v in reference["colbert_vecs"])
    unk_row = data[-1]["sparse_embedding"]
    assert 3 not in [entry["index"] for entry in unk_row]  # <unk> (id 3) is dropped, as FlagEmbedding drops it


def test_tei_routes_give_the_same_outputs(server: Cluster, reference: dict[str, Any]) -> None:
    sparse = _post(server, "/embed_sparse", {"inputs": INPUTS})
    for row, want in zip(sparse, reference["lexical_weights"]):
        _assert_sparse_matches(row, want)
    token_vectors = _post(server, "/embed_all", {"inputs": INPUTS})
    for vectors, want in zip(token_vectors, reference["colbert_vecs"]):
        assert _cosines(np.array(vectors, dtype=np.float32), want).min() >= 0.9999
    dense = np.array(_post(server, "/embed", {"inputs": INPUTS}), dtype=np.float32)
    assert _cosines(dense, reference["dense_vecs"]).min() >= 0.9999


def test_subsets_and_formats(server: Cluster, reference: dict[str, Any]) -> None:
    body = _post(server, "/v1/embeddings", {"input": INPUTS[0], "outputs": ["sparse"]})
    assert set(body["data"][0]) == {"object", "index", "sparse_embedding"}
    _assert_sparse_matches(body["data"][0]["sparse_embedding"], reference["lexical_weights"][0])
    body = _post(server, "/v1/embeddings", {"input": INPUTS[:2], "outputs": ["colbert", "dense"],
                                            "encoding_format": "base64", "dimensions": 8})
    first = body["data"][0]
    dense = np.frombuffer(base64.b64decode(first["embedding"]), dtype="<f4")
    assert dense.shape == (8,) and abs(np.linalg.norm(dense) - 1) < 1e-5
    vectors = np.stack([np.frombuffer(base64.b64decode(v), dtype="<f4") for v in first["colbert_embedding"]])
    assert _cosines(vectors, reference["colbert_vecs"][0]).min() >= 0.9999


def test_bad_requests_are_refused_in_the_api_format(server: Cluster) -> None:
    error = _post(server, "/v1/embeddings", {"input": "x", "outputs": ["sparse", "late"]}, status=400)["error"]
    assert error["param"] == "outputs" or "outputs" in str(error)
    error = _post(server, "/v1/embeddings", {"input": "x", "outputs": ["sparse"], "encoding_format": "int8"},
                  status=400)["error"]
    assert error["param"] == "encoding_format"
    error = _post(server, "/v1/embeddings", {"input": "x", "outputs": [], "model": "m"}, status=400)["error"]
    assert "outputs" in error["message"]
    too_long = " ".join(["fox"] * 100)
    _post(server, "/embed_all", {"inputs": too_long}, status=422)
    truncated = _post(server, "/embed_all", {"inputs": too_long, "truncate": True})
    assert len(truncated[0]) == 63  # 64 tokens, CLS excluded
    info = httpx.get(server.url + "/info", timeout=10).json()
    assert info["model_kind"] == "embedding"
    paths = httpx.get(server.url + "/openapi.json", timeout=10).json()["paths"]
    assert "/embed_all" in paths and "/embed_sparse" in paths


def test_dense_model_names_its_outputs(cluster) -> None:
    response = httpx.post(cluster.url + "/v1/embeddings", json={"input": "x", "outputs": ["dense", "colbert"]},
                          timeout=30)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "outputs" and "gives dense outputs, not colbert" in error["message"]
    response = httpx.post(cluster.url + "/embed_sparse", json={"inputs": "x"}, timeout=30)
    assert response.status_code == 424 and "BGE-M3" in response.json()["error"]
    plain = httpx.post(cluster.url + "/v1/embeddings", json={"input": "x"}, timeout=30).json()["data"]
    twice = httpx.post(cluster.url + "/v1/embeddings", json={"input": "x", "outputs": ["dense", "dense"]}, timeout=30)
    assert twice.status_code == 200 and twice.json()["data"] == plain  # dense alone, however often it is named
