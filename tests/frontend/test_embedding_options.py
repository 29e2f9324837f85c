"""Every embedding option over HTTP against real processes: quantized outputs, Matryoshka dimensions,
prompts and instructions, truncation direction, and each one's error.

Two tiny Qwen3 checkpoints are written here: one shaped like pplx-embed (bidirectional, mean pooling,
its sentence-transformers pipeline ending in the tanh quantizer its card describes) and one like
Qwen3-Embedding (causal, last token, normalised, with the "Instruct: ...\\nQuery:" query prompt). The
packaged MiniLM (the session's cluster) stands for a plain float model.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from quiver.bench.engine.checkpoints import make_bidirectional, save_checkpoint
from tests.cluster import Cluster

QWEN3_QUERY_PROMPT = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"
TEXTS = ["w10 w11 w12", "w40 w5 w6 w7 w8", "w90", "w20 w21 w22 w23 w24 w25 w26"]


def qwen3_model(bidirectional: bool) -> Any:
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rope_theta=10000.0, rms_norm_eps=1e-6,
    )
    torch.manual_seed(3)
    model = Qwen3Model(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.2)
            else:
                param.uniform_(0.5, 1.5)
    return make_bidirectional(model) if bidirectional else model


def hf_tokenize(path: Path, text: str) -> list[int]:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))(text)["input_ids"]


def reference(model: Any, path: Path, texts: list[str], pooling: str, normalize: bool) -> np.ndarray:
    """transformers' pooled output of each text alone, tokenized by transformers."""
    rows = []
    with torch.no_grad():
        for text in texts:
            hidden = model(input_ids=torch.tensor([hf_tokenize(path, text)])).last_hidden_state[0]
            row = hidden.mean(0) if pooling == "mean" else hidden[-1]
            rows.append(torch.nn.functional.normalize(row, dim=0) if normalize else row)
    return torch.stack(rows).numpy()


@pytest.fixture(scope="module")
def quantizing(tmp_path_factory: pytest.TempPathFactory):
    """A pplx-embed-shaped model: its modules.json ends in st_quantize.FlexibleQuantizer."""
    model = qwen3_model(bidirectional=True)
    path = save_checkpoint(model, tmp_path_factory.mktemp("pplx") / "pplx-tiny", pooling="mean", normalize=False)
    modules = json.loads((path / "modules.json").read_text())
    modules.append({"idx": 2, "name": "2", "path": "", "type": "st_quantize.FlexibleQuantizer"})
    (path / "modules.json").write_text(json.dumps(modules))
    cluster = Cluster(workers=1, model=str(path)).start()
    cluster.reference = reference(model, path, TEXTS, "mean", normalize=False)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def instructed(tmp_path_factory: pytest.TempPathFactory):
    """A Qwen3-Embedding-shaped model with a default prompt ("tagged") to show that it applies."""
    model = qwen3_model(bidirectional=False)
    path = save_checkpoint(model, tmp_path_factory.mktemp("qwen3emb") / "qwen3-embedding-tiny", pooling="lasttoken",
                           normalize=True)
    prompts = {"query": QWEN3_QUERY_PROMPT, "document": "", "tagged": "w7 w8 "}
    (path / "config_sentence_transformers.json").write_text(json.dumps({"prompts": prompts,
                                                                          "default_prompt_name": "tagged"}))
    cluster = Cluster(workers=1, model=str(path)).start()
    cluster.model, cluster.path = model, path
    yield cluster
    cluster.stop()


def embeddings(cluster: Cluster, body: dict, route: str = "/v1/embeddings") -> Any:
    response = httpx.post(cluster.url + route, json=body, timeout=60)
    assert response.status_code == 200, response.text
    if route == "/embed":
        return np.array(response.json(), dtype=np.float32)
    return [d["embedding"] for d in response.json()["data"]]


def error(cluster: Cluster, route: str, body: dict, status: int) -> str:
    response = httpx.post(cluster.url + route, json=body, timeout=60)
    assert response.status_code == status, response.text
    payload = response.json()
    return payload["error"]["message"] if route.startswith("/v1/") else payload["error"]


def card_int8(rows: np.ndarray) -> np.ndarray:
    """pplx-embed's int8: round(127 * tanh(x)), clamped to int8."""
    return np.clip(np.round(np.tanh(rows.astype(np.float64)) * 127), -128, 127).astype(np.int64)


def card_bits(rows: np.ndarray) -> np.ndarray:
    """Sign bits (x >= 0) packed eight to a byte, first dimension in the high bit."""
    return np.packbits(rows >= 0, axis=-1).astype(np.int64)


# ---- quantized outputs ------------------------------------------------------------------------------------


def test_float_output_matches_transformers(quantizing):
    served = np.array(embeddings(quantizing, {"input": TEXTS}), dtype=np.float32)
    np.testing.assert_allclose(served, quantizing.reference, atol=1e-4, rtol=1e-4)


def test_int8_and_binary_follow_the_model_card(quantizing):
    floats = np.array(embeddings(quantizing, {"input": TEXTS}), dtype=np.float32)
    int8 = np.array(embeddings(quantizing, {"input": TEXTS, "encoding_format": "int8"}))
    np.testing.assert_array_equal(int8, card_int8(floats))
    assert int8.shape == (len(TEXTS), 32) and int8.min() >= -128 and int8.max() <= 127
    ubinary = np.array(embeddings(quantizing, {"input": TEXTS, "encoding_format": "ubinary"}))
    np.testing.assert_array_equal(ubinary, card_bits(floats))
    assert ubinary.shape == (len(TEXTS), 4) and ubinary.min() >= 0 and ubinary.max() <= 255
    binary = np.array(embeddings(quantizing, {"input": TEXTS, "encoding_format": "binary"}))
    np.testing.assert_array_equal(binary, ubinary - 128)


def test_dimensions_cut_before_quantizing(quantizing):
    floats = np.array(embeddings(quantizing, {"input": TEXTS, "dimensions": 12}), dtype=np.float32)
    np.testing.assert_allclose(floats, quantizing.reference[:, :12], atol=1e-4, rtol=1e-4)  # no Normalize module
    int8 = np.array(embeddings(quantizing, {"input": TEXTS, "dimensions": 12, "encoding_format": "int8"}))
    np.testing.assert_array_equal(int8, card_int8(floats))
    bits = np.array(embeddings(quantizing, {"input": TEXTS, "dimensions": 12, "encoding_format": "ubinary"}))
    assert bits.shape == (len(TEXTS), 2)  # 12 bits, padded to two bytes with zeros
    np.testing.assert_array_equal(bits, card_bits(floats))
    assert (bits[:, 1] & 0x0F == 0).all()


def test_openai_client_with_dimensions_and_base64(quantizing):
    import openai
    client = openai.OpenAI(base_url=quantizing.url + "/v1", api_key="unused")
    # The client asks for base64 itself and decodes it as little-endian float32.
    result = client.embeddings.create(model="pplx-tiny", input=TEXTS, dimensions=20)
    served = np.array([d.embedding for d in result.data], dtype=np.float32)
    np.testing.assert_allclose(served, quantizing.reference[:, :20], atol=1e-4, rtol=1e-4)
    raw = httpx.post(quantizing.url + "/v1/embeddings", json={"input": TEXTS[0], "encoding_format": "base64"},
                     timeout=30).json()["data"][0]["embedding"]
    np.testing.assert_allclose(np.frombuffer(base64.b64decode(raw), dtype="<f4"), quantizing.reference[0],
                               atol=1e-4, rtol=1e-4)


def test_info_names_the_encoding_formats(quantizing, cluster):
    info = httpx.get(quantizing.url + "/info", timeout=10).json()
    assert info["encoding_formats"] == ["float", "base64", "int8", "binary", "ubinary", "base64_int8", "base64_binary"]
    assert info["instruction_template"] is None
    assert httpx.get(cluster.url + "/info", timeout=10).json()["encoding_formats"] == ["float", "base64"]


@pytest.mark.parametrize("encoding_format", ["int8", "binary", "ubinary", "base64_int8", "base64_binary"])
def test_float_models_refuse_quantized_formats(cluster, encoding_format):
    message = error(cluster, "/v1/embeddings", {"input": "x", "encoding_format": encoding_format}, 400)
    assert encoding_format in message and "quantized" in message


def test_quantizing_model_errors(quantizing):
    assert "instruction" in error(quantizing, "/v1/embeddings", {"input": "w5", "instruction": "find"}, 400)
    assert "dimensions" in error(quantizing, "/v1/embeddings", {"input": "w5", "dimensions": 33}, 400)
    assert "encoding_format" in error(quantizing, "/v1/embeddings", {"input": "w5", "encoding_format": "uint8"}, 400)


# ---- prompts and instructions ------------------------------------------------------------------------------


def test_default_prompt_applies_unless_a_prompt_is_named(instructed):
    expected = reference(instructed.model, instructed.path, ["w7 w8 " + t for t in TEXTS], "lasttoken", True)
    np.testing.assert_allclose(embeddings(instructed, {"inputs": TEXTS}, "/embed"), expected, atol=1e-4, rtol=1e-4)
    spelled_out = embeddings(instructed, {"inputs": ["w7 w8 " + t for t in TEXTS], "prompt_name": "document"}, "/embed")
    np.testing.assert_allclose(spelled_out, expected, atol=1e-5, rtol=1e-5)
    plain = reference(instructed.model, instructed.path, TEXTS, "lasttoken", True)
    openai_plain = embeddings(instructed, {"input": TEXTS, "prompt_name": "document"})
    np.testing.assert_allclose(np.array(openai_plain, dtype=np.float32), plain, atol=1e-4, rtol=1e-4)


def test_instruction_uses_the_qwen3_format(instructed):
    instruction = "w30 w31 w32"
    formatted = [f"Instruct: {instruction}\nQuery:{text}" for text in TEXTS]
    expected = reference(instructed.model, instructed.path, formatted, "lasttoken", True)
    served = np.array(embeddings(instructed, {"input": TEXTS, "instruction": instruction}), dtype=np.float32)
    np.testing.assert_allclose(served, expected, atol=1e-4, rtol=1e-4)
    on_tei = embeddings(instructed, {"inputs": TEXTS, "instruction": instruction}, "/embed")
    np.testing.assert_allclose(on_tei, served, atol=1e-5, rtol=1e-5)
    tokens = httpx.post(instructed.url + "/tokenize", json={"inputs": "w10", "instruction": instruction},
                        timeout=10).json()[0]
    assert [t["id"] for t in tokens] == hf_tokenize(instructed.path, f"Instruct: {instruction}\nQuery:w10")
    # The model's own "query" prompt is the same format with the web-search task.
    by_prompt = embeddings(instructed, {"inputs": TEXTS, "prompt_name": "query"}, "/embed")
    web = "Given a web search query, retrieve relevant passages that answer the query"
    by_instruction = embeddings(instructed, {"inputs": TEXTS, "instruction": web}, "/embed")
    np.testing.assert_allclose(by_prompt, by_instruction, atol=1e-6, rtol=1e-6)
    info = httpx.get(instructed.url + "/info", timeout=10).json()
    assert info["instruction_template"] == "Instruct: {instruction}\nQuery:"


def test_prompt_and_instruction_errors(instructed, cluster):
    both = {"input": "w5", "instruction": "w6", "prompt_name": "query"}
    assert "not both" in error(instructed, "/v1/embeddings", both, 400)
    assert "prompt_name" in error(instructed, "/embed", {"inputs": "w5", "prompt_name": "passage"}, 422)
    assert "instruction" in error(instructed, "/embed", {"inputs": "w5", "instruction": 5}, 422)
    assert "takes no instruction" in error(cluster, "/embed", {"inputs": "x", "instruction": "find"}, 400)


# ---- Matryoshka, truncation and token ids on the packaged MiniLM --------------------------------------------


def test_dimensions_truncate_then_renormalize(cluster):
    full = embeddings(cluster, {"inputs": TEXTS[:2]}, "/embed")
    short = embeddings(cluster, {"inputs": TEXTS[:2], "dimensions": 64}, "/embed")
    expected = full[:, :64] / np.linalg.norm(full[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(short, expected, atol=1e-5)
    assert "384" in error(cluster, "/embed", {"inputs": "x", "dimensions": 385}, 400)


def test_truncation_direction_keeps_the_chosen_end(cluster):
    from transformers import AutoTokenizer

    from quiver.common.model_info import default_model_dir

    tokenizer = AutoTokenizer.from_pretrained(str(default_model_dir()))
    text = " ".join(f"word{i}" for i in range(300))
    for side in ("left", "right"):
        tokenizer.truncation_side = side
        ids = tokenizer(text, truncation=True, max_length=256)["input_ids"]
        by_text = embeddings(cluster, {"input": text, "truncate": True, "truncation_direction": side})
        by_ids = embeddings(cluster, {"input": ids})
        np.testing.assert_allclose(by_text, by_ids, atol=1e-5)
