"""Contextual chunk embeddings (late chunking) over HTTP by real processes: POST /v1/contextualizedembeddings
against transformers run on each whole document with its chunks' spans pooled by hand.

pplx-embed's published layout (tiny, random weights; no special tokens around a text, unnormalised
output) and the packaged all-MiniLM-L6-v2 ("[CLS] … [SEP]" around the document, normalised output).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from tests.cluster import Cluster
from tests.worker.engine.published import PPLX_MAX_POSITIONS, TEXTS, pplx_embed

DOCUMENTS = [[TEXTS[0], TEXTS[1]], [TEXTS[2]], [TEXTS[3], TEXTS[4], TEXTS[5]]]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pplx_embed(tmp_path_factory.mktemp("pplx-context"))


@pytest.fixture(scope="module")
def server(checkpoint: Path):
    with Cluster(workers=1, model=str(checkpoint)) as cluster:
        yield cluster


def _tokenizer(path: Path):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))


def _spans(tokenizer, document: list[str], head: list[int], tail: list[int]) -> tuple[list[int], list[slice]]:
    ids, spans = list(head), []
    for chunk in document:
        part = tokenizer(chunk, add_special_tokens=False)["input_ids"]
        spans.append(slice(len(ids), len(ids) + len(part)))
        ids += part
    return ids + list(tail), spans


def _pplx_reference(path: Path) -> list[np.ndarray]:
    from transformers import Qwen3Config, Qwen3Model

    values = json.loads((path / "config.json").read_text())
    for key in ("model_type", "architectures", "auto_map", "use_bidirectional_attention"):
        values.pop(key)
    model = Qwen3Model.from_pretrained(str(path), config=Qwen3Config(**values), dtype=torch.float32).eval()
    tokenizer = _tokenizer(path)
    out = []
    with torch.no_grad():
        for document in DOCUMENTS:
            ids, spans = _spans(tokenizer, document, [], [])
            visible = torch.zeros(1, 1, len(ids), len(ids))  # bidirectional, as pplx-embed runs
            hidden = model(input_ids=torch.tensor([ids]), attention_mask=visible).last_hidden_state[0]
            out.append(np.stack([hidden[span].mean(0).numpy() for span in spans]))
    return out


def _post(url: str, body: dict, status: int = 200) -> dict:
    response = httpx.post(url + "/v1/contextualizedembeddings", json=body, timeout=60)
    assert response.status_code == status, response.text
    return response.json()


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def _vectors(body: dict) -> list[np.ndarray]:
    assert [document["index"] for document in body["data"]] == list(range(len(body["data"])))
    out = []
    for document in body["data"]:
        assert [item["index"] for item in document["data"]] == list(range(len(document["data"])))
        out.append(np.array([item["embedding"] for item in document["data"]], dtype=np.float32))
    return out


def test_chunk_vectors_match_the_whole_document_reference(server: Cluster, checkpoint: Path) -> None:
    body = _post(server.url, {"input": DOCUMENTS, "model": "pplx-embed-context-v1-0.6b"})
    served, expected = _vectors(body), _pplx_reference(checkpoint)
    assert [len(v) for v in served] == [len(d) for d in DOCUMENTS]
    for got, want in zip(served, expected):
        assert _cosines(got, want).min() >= 0.9999
        np.testing.assert_allclose(np.linalg.norm(got, axis=1), np.linalg.norm(want, axis=1), rtol=1e-3)
    tokenizer = _tokenizer(checkpoint)
    assert body["usage"]["prompt_tokens"] == sum(len(tokenizer(c, add_special_tokens=False)["input_ids"])
                                                 for d in DOCUMENTS for c in d)
    # Context matters: a chunk of a longer document is not the chunk embedded alone...
    alone = httpx.post(server.url + "/v1/embeddings", json={"input": DOCUMENTS[0]}, timeout=60).json()["data"]
    alone_rows = np.array([item["embedding"] for item in alone], dtype=np.float32)
    assert _cosines(served[0], alone_rows).max() < 0.999
    # ...while a document of one chunk is exactly that chunk's embedding.
    single = httpx.post(server.url + "/v1/embeddings", json={"input": DOCUMENTS[1][0]}, timeout=60).json()["data"]
    assert _cosines(served[1], np.array([single[0]["embedding"]], dtype=np.float32)).min() >= 0.9999


def test_quantized_and_matryoshka_forms(server: Cluster, checkpoint: Path) -> None:
    expected = _pplx_reference(checkpoint)
    int8 = _vectors(_post(server.url, {"input": DOCUMENTS, "encoding_format": "int8"}))
    for got, want in zip(int8, expected):
        assert np.abs(got - np.clip(np.rint(np.tanh(want) * 127), -128, 127)).max() <= 1
    short = _vectors(_post(server.url, {"input": DOCUMENTS, "dimensions": 16}))
    for got, want in zip(short, expected):
        assert got.shape[1] == 16 and _cosines(got, want[:, :16]).min() >= 0.9999


def test_limits_and_bad_documents(server: Cluster) -> None:
    too_long = [" ".join(["sleep"] * (PPLX_MAX_POSITIONS // 2 + 1))] * 2
    error = _post(server.url, {"input": [DOCUMENTS[0], too_long]}, status=413)["error"]
    assert "document 1 has" in error["message"] and f"context of {PPLX_MAX_POSITIONS}" in error["message"]
    assert _post(server.url, {"input": [[]]}, status=400)["error"]["code"] == "empty_input"
    assert _post(server.url, {"input": [["fox", ""]]}, status=400)["error"]["code"] == "empty_input"
    assert _post(server.url, {"input": []}, status=400)["error"]["code"] == "empty_input"
    assert _post(server.url, {"input": "a string"}, status=400)["error"]["param"] == "input"
    info = httpx.get(server.url + "/info", timeout=10).json()
    assert info["limits"]["contextual_max_document_tokens"] == PPLX_MAX_POSITIONS
    assert "/v1/contextualizedembeddings" in httpx.get(server.url + "/openapi.json", timeout=10).json()["paths"]


def test_minilm_wraps_the_document_in_its_special_tokens(cluster) -> None:
    from transformers import AutoModel, AutoTokenizer

    from quiver.common.model_info import default_model_dir

    path = default_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModel.from_pretrained(str(path), dtype=torch.float32).eval()
    served = _vectors(_post(cluster.url, {"input": DOCUMENTS}))
    with torch.no_grad():
        for document, got in zip(DOCUMENTS, served):
            ids, spans = _spans(tokenizer, document, [tokenizer.cls_token_id], [tokenizer.sep_token_id])
            hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            want = np.stack([hidden[span].mean(0).numpy() for span in spans])
            want /= np.linalg.norm(want, axis=1, keepdims=True)
            assert _cosines(got, want).min() >= 0.9999
            np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
