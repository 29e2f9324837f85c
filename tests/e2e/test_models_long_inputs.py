"""Long inputs split into windows (opt-in) on the packaged all-MiniLM-L6-v2 (256 tokens), over HTTP,
against transformers' BertModel run window by window and averaged by tokens, written out here."""

from __future__ import annotations

import functools

import httpx
import numpy as np
import torch

from quiver.common.model_info import default_model_dir

LIMIT = 256
WORDS = ("embedding servers split long documents into windows so that every token is seen once and the "
         "vectors of the windows are averaged by their token counts before normalisation ").split()
LONG_TEXT = " ".join(WORDS[i % len(WORDS)] + ("s" if i % 7 == 0 else "") for i in range(700))
SHORT_TEXT = "a short sentence fits in one window"


@functools.cache
def _reference_parts():
    from transformers import AutoModel, AutoTokenizer

    path = str(default_model_dir())
    return AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()


def _windowed_reference(ids: list[int], wrap: bool) -> np.ndarray:
    """Mean-pooled BertModel output per window of at most LIMIT tokens, token-weighted mean, normalised."""
    tokenizer, model = _reference_parts()
    body = ids[1:-1] if wrap else ids
    room = LIMIT - 2 if wrap else LIMIT
    vectors, weights = [], []
    with torch.no_grad():
        for start in range(0, len(body), room):
            window = body[start:start + room]
            if wrap:
                window = [tokenizer.cls_token_id, *window, tokenizer.sep_token_id]
            hidden = model(input_ids=torch.tensor([window])).last_hidden_state[0]
            vectors.append(hidden.mean(0).numpy())
            weights.append(len(window))
    mean = np.average(np.stack(vectors), axis=0, weights=weights)
    return mean / np.linalg.norm(mean)


def _embed(url: str, inputs: object, **extra: object) -> httpx.Response:
    return httpx.post(url + "/v1/embeddings", json={"input": inputs, **extra}, timeout=120)


def test_long_text_is_windowed_and_averaged(cluster) -> None:
    tokenizer, _ = _reference_parts()
    ids = tokenizer(LONG_TEXT)["input_ids"]
    assert len(ids) > 2 * LIMIT
    response = _embed(cluster.url, [LONG_TEXT, SHORT_TEXT], split_long_inputs=True)
    assert response.status_code == 200, response.text
    rows = np.array([item["embedding"] for item in response.json()["data"]], dtype=np.float32)
    expected = np.stack([_windowed_reference(ids, True), _windowed_reference(tokenizer(SHORT_TEXT)["input_ids"], True)])
    assert ((rows * expected).sum(1)).min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)
    assert response.json()["usage"]["prompt_tokens"] >= len(ids)


def test_long_token_ids_and_tei_route(cluster) -> None:
    ids = list(range(1000, 1000 + 600))
    response = httpx.post(cluster.url + "/embed", json={"inputs": [ids], "split_long_inputs": True}, timeout=120)
    assert response.status_code == 200, response.text
    row = np.array(response.json()[0], dtype=np.float32)
    assert float(row @ _windowed_reference(ids, False)) >= 0.9999


def test_split_is_opt_in(cluster) -> None:
    assert _embed(cluster.url, LONG_TEXT).status_code == 400  # OpenAI and vLLM answer an over-long input with 400
    assert httpx.get(cluster.url + "/info", timeout=10).json()["long_inputs"][0] == "error"


def test_server_flag_turns_it_on(cluster) -> None:
    _, url = cluster.extra_frontend(["--split-long-inputs"])
    assert httpx.get(url + "/info", timeout=10).json()["long_inputs"] == ["split", "error", "truncate"]
    on = _embed(url, LONG_TEXT)
    assert on.status_code == 200, on.text
    assert _embed(url, LONG_TEXT, split_long_inputs=False).status_code == 400
    asked = _embed(cluster.url, LONG_TEXT, split_long_inputs=True).json()["data"][0]["embedding"]
    np.testing.assert_allclose(on.json()["data"][0]["embedding"], asked, atol=1e-6)
