"""pplx-embed as published, served over HTTP by real processes, against transformers' bidirectional Qwen3Model.

The checkpoint is perplexity-ai/pplx-embed-v1-0.6b's layout at tiny sizes (tests/worker/engine/published.py):
its own model_type and architecture, an auto_map to remote code that must never run, mean pooling
and the tanh quantizer. Float vectors must match the reference in cosine (≥ 0.9999), the int8 and
binary forms must be the model card's quantisation of it, Matryoshka keeps the first N dimensions.
"""

from __future__ import annotations

import base64
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.cluster import Cluster
from tests.worker.engine.published import REMOTE_CODE_MARKER, TEXTS, pplx_embed, pplx_reference


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pplx_embed(tmp_path_factory.mktemp("pplx"))


@pytest.fixture(scope="module")
def server(checkpoint: Path):
    with Cluster(workers=1, model=str(checkpoint)) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def reference(checkpoint: Path) -> np.ndarray:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(checkpoint / "tokenizer.json"))
    return pplx_reference(checkpoint, [tokenizer(text)["input_ids"] for text in TEXTS])


def _embed(server: Cluster, **extra: object) -> list:
    response = httpx.post(server.url + "/v1/embeddings", json={"input": TEXTS, **extra}, timeout=60)
    assert response.status_code == 200, response.text
    return [item["embedding"] for item in response.json()["data"]]


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_float_vectors_match_bidirectional_reference(server: Cluster, reference: np.ndarray) -> None:
    rows = np.array(_embed(server), dtype=np.float32)
    assert rows.shape == reference.shape
    assert _cosines(rows, reference).min() >= 0.9999
    # Unnormalised, as the model card says its native output is.
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), np.linalg.norm(reference, axis=1), rtol=1e-3)
    assert not np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-2)


def test_quantized_forms(server: Cluster, reference: np.ndarray) -> None:
    expected_int8 = np.clip(np.rint(np.tanh(reference) * 127), -128, 127)
    int8 = np.array(_embed(server, encoding_format="int8"))
    assert np.abs(int8 - expected_int8).max() <= 1
    assert (int8 == expected_int8).mean() > 0.95
    perplexity_int8 = np.stack([np.frombuffer(base64.b64decode(s), dtype=np.int8) for s in
                                _embed(server, encoding_format="base64_int8")])
    np.testing.assert_array_equal(perplexity_int8, int8)

    clear = np.abs(reference) > 1e-3  # signs the float error cannot flip
    bits = np.stack([np.unpackbits(np.frombuffer(base64.b64decode(s), dtype=np.uint8))[: reference.shape[1]]
                     for s in _embed(server, encoding_format="base64_binary")])
    np.testing.assert_array_equal(bits[clear], (reference >= 0)[clear])
    ubinary = np.array(_embed(server, encoding_format="ubinary"), dtype=np.uint8)
    np.testing.assert_array_equal(np.unpackbits(ubinary, axis=1)[:, : reference.shape[1]], bits)


def test_matryoshka_keeps_leading_dimensions(server: Cluster, reference: np.ndarray) -> None:
    short = np.array(_embed(server, dimensions=16), dtype=np.float32)
    assert short.shape == (len(TEXTS), 16)
    assert _cosines(short, reference[:, :16]).min() >= 0.9999
    int8 = np.array(_embed(server, dimensions=16, encoding_format="int8"))
    assert int8.shape == (len(TEXTS), 16)


def test_info_and_remote_code(server: Cluster, checkpoint: Path) -> None:
    info = httpx.get(server.url + "/info", timeout=10).json()
    assert info["model_type"] == "bidirectional_pplx_qwen3"
    assert info["architecture"] == "PPLXQwen3Model"
    assert info["pooling"] == "mean" and info["normalize"] is False
    assert {"int8", "base64_int8", "base64_binary"} <= set(info["encoding_formats"])
    assert not (checkpoint / REMOTE_CODE_MARKER).exists(), "the checkpoint's remote code was executed"


def test_unknown_encoding_format_is_refused(server: Cluster) -> None:
    response = httpx.post(server.url + "/v1/embeddings", json={"input": "x", "encoding_format": "base64_int4"},
                          timeout=10)
    assert response.status_code == 400  # a request validation error, in OpenAI's format
    assert "base64_int8" in response.json()["error"]["message"]
