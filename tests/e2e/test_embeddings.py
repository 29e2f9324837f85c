"""Embeddings served over HTTP by real processes against sentence-transformers' own encode()."""

from __future__ import annotations

import base64

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from tests.corpus import sentences

MIN_COSINE = 0.9999


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return np.sum(a * b, axis=1)


def post(cluster, path: str, body: dict, timeout: float = 120) -> httpx.Response:
    return httpx.post(cluster.url + path, json=body, timeout=timeout)


def test_embed_matches_sentence_transformers(cluster, st_model):
    texts = sentences(300)
    response = post(cluster, "/embed", {"inputs": texts})
    assert response.status_code == 200, response.text
    served = np.array(response.json(), dtype=np.float32)
    reference = st_model.encode(texts, convert_to_numpy=True, normalize_embeddings=False)
    assert served.shape == reference.shape == (len(texts), 384)
    cos = cosines(served, reference)
    assert cos.min() >= MIN_COSINE, f"worst cosine {cos.min()} at input {int(cos.argmin())}: {texts[int(cos.argmin())]!r}"
    # The model ends in a Normalize module, so both sides are unit vectors.
    np.testing.assert_allclose(np.linalg.norm(served, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(reference, axis=1), 1.0, atol=1e-5)


def test_openai_route_matches_sentence_transformers(cluster, st_model):
    texts = sentences(40)
    response = post(cluster, "/v1/embeddings", {"input": texts, "model": "sentence-transformers/all-MiniLM-L6-v2"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list"
    assert body["model"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert [d["index"] for d in body["data"]] == list(range(len(texts)))
    assert all(d["object"] == "embedding" for d in body["data"])
    served = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
    assert cosines(served, st_model.encode(texts)).min() >= MIN_COSINE
    expected_tokens = sum(len(st_model.tokenizer(t, truncation=True, max_length=256)["input_ids"]) for t in texts)
    assert body["usage"] == {"prompt_tokens": expected_tokens, "total_tokens": expected_tokens}
    for header in ("x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time"):
        assert float(response.headers[header]) >= 0.0


def test_alone_equals_inside_a_batch_of_64(cluster):
    texts = sentences(64)
    batch = np.array(post(cluster, "/embed", {"inputs": texts}).json(), dtype=np.float32)
    for index in (0, 7, 31, 63):
        alone = np.array(post(cluster, "/embed", {"inputs": texts[index]}).json(), dtype=np.float32)
        assert alone.shape == (1, 384)
        assert cosines(alone, batch[index:index + 1])[0] >= MIN_COSINE


def test_token_id_input_equals_text_input(cluster, st_model):
    texts = sentences(5)
    ids = [st_model.tokenizer(t)["input_ids"] for t in texts]
    by_text = np.array([d["embedding"] for d in post(cluster, "/v1/embeddings", {"input": texts}).json()["data"]])
    by_ids = np.array([d["embedding"] for d in post(cluster, "/v1/embeddings", {"input": ids}).json()["data"]])
    single = post(cluster, "/v1/embeddings", {"input": ids[0]}).json()["data"]
    assert cosines(by_text, by_ids).min() >= MIN_COSINE
    assert len(single) == 1 and cosines(np.array([single[0]["embedding"]]), by_text[:1])[0] >= MIN_COSINE


def test_openai_client(cluster, st_model):
    import openai
    client = openai.OpenAI(base_url=cluster.url + "/v1", api_key="unused")
    texts = sentences(12)
    reference = st_model.encode(texts)
    # The client asks for base64 by default and decodes it itself; ask for floats explicitly too.
    for fmt in (openai.NOT_GIVEN, "float"):
        result = client.embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", input=texts,
                                          encoding_format=fmt)
        served = np.array([d.embedding for d in result.data], dtype=np.float32)
        assert cosines(served, reference).min() >= MIN_COSINE
        assert result.usage.prompt_tokens > 0
    shorter = client.embeddings.create(model="sentence-transformers/all-MiniLM-L6-v2", input=texts[0], dimensions=128)
    vector = np.array(shorter.data[0].embedding)
    assert vector.shape == (128,)
    assert abs(np.linalg.norm(vector) - 1.0) < 1e-5
    expected = reference[0][:128] / np.linalg.norm(reference[0][:128])
    assert float(vector @ expected) >= MIN_COSINE


def test_base64_encoding_is_little_endian_float32(cluster):
    body = post(cluster, "/v1/embeddings", {"input": ["hello world"], "encoding_format": "base64"}).json()
    floats = post(cluster, "/v1/embeddings", {"input": ["hello world"]}).json()
    decoded = np.frombuffer(base64.b64decode(body["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(decoded, np.array(floats["data"][0]["embedding"], dtype=np.float32), rtol=1e-6)


def test_huggingface_inference_client(cluster, st_model, monkeypatch):
    import huggingface_hub as hub
    # The suite runs with HF_HUB_OFFLINE=1, which the client applies to every URL; ours is on loopback.
    monkeypatch.setattr(hub.constants, "HF_HUB_OFFLINE", False)
    client = hub.InferenceClient(model=cluster.url + "/embed")
    texts = sentences(6)
    served = client.feature_extraction(texts)
    assert served.shape == (6, 384)
    assert cosines(served, st_model.encode(texts)).min() >= MIN_COSINE
    one = client.feature_extraction(texts[0], normalize=False)
    raw = st_model.encode([texts[0]], normalize_embeddings=False)
    assert one.shape == (1, 384)
    assert cosines(one, raw)[0] >= MIN_COSINE


def _dispatches_by_worker(cluster) -> dict[str, float]:
    text = httpx.get(cluster.broker_metrics_url, timeout=5).text
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "quiver_broker_dispatches":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    counts[sample.labels["worker"]] = sample.value
    return counts


def test_two_thousand_inputs_spread_over_both_workers_in_order(cluster, st_model):
    texts = sentences(2000)
    assert len(texts) == 2000
    before = _dispatches_by_worker(cluster)
    response = post(cluster, "/v1/embeddings", {"input": texts}, timeout=300)
    assert response.status_code == 200, response.text
    data = response.json()["data"]
    assert [d["index"] for d in data] == list(range(2000))
    served = np.array([d["embedding"] for d in data], dtype=np.float32)
    # Every 8th row against the reference: enough to catch any chunk out of place, at an eighth of the cost.
    sample = np.arange(0, 2000, 8)
    reference = st_model.encode([texts[i] for i in sample], batch_size=128)
    assert cosines(served[sample], reference).min() >= MIN_COSINE
    after = _dispatches_by_worker(cluster)
    served_by = {name for name, count in after.items() if count > before.get(name, 0.0)}
    assert served_by == {"cpu-0", "cpu-1"}, after
