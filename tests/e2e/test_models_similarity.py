"""vLLM's /score on an embedding model (the packaged all-MiniLM-L6-v2): cosine similarity of the two
sides, against sentence-transformers' own encoder and similarity function."""

from __future__ import annotations

import httpx
import numpy as np

QUERY = "how do cats sleep"
DOCUMENTS = [
    "cats sleep for most of the day, often in warm places",
    "the stock market closed higher on friday",
    "a kitten curls up and sleeps next to its mother",
    "recipes for a quick vegetable soup",
]


def _scores(cluster, text_1, text_2) -> list[float]:
    response = httpx.post(cluster.url + "/score", json={"text_1": text_1, "text_2": text_2}, timeout=60)
    assert response.status_code == 200, response.text
    body = response.json()
    assert [item["index"] for item in body["data"]] == list(range(len(body["data"])))
    assert body["usage"]["prompt_tokens"] > 0
    return [item["score"] for item in body["data"]]


def _reference(st_model, left: list[str], right: list[str]) -> np.ndarray:
    similarity = st_model.similarity(st_model.encode(left), st_model.encode(right)).numpy()
    return similarity[0] if len(left) == 1 else np.diag(similarity)


def test_one_to_many(cluster, st_model) -> None:
    scores = _scores(cluster, QUERY, DOCUMENTS)
    np.testing.assert_allclose(scores, _reference(st_model, [QUERY], DOCUMENTS), atol=1e-4)
    assert np.argmax(scores) in (0, 2)


def test_one_to_one_and_pairs(cluster, st_model) -> None:
    np.testing.assert_allclose(_scores(cluster, QUERY, DOCUMENTS[0]),
                               _reference(st_model, [QUERY], DOCUMENTS[:1]), atol=1e-4)
    queries = [QUERY, "stock prices", "soup", "kittens"]
    np.testing.assert_allclose(_scores(cluster, queries, DOCUMENTS), _reference(st_model, queries, DOCUMENTS),
                               atol=1e-4)


def test_bad_pairings_are_client_errors(cluster) -> None:
    for text_1, text_2 in ((["a", "b"], ["c", "d", "e"]), (QUERY, []), (QUERY, [""])):
        response = httpx.post(cluster.url + "/score", json={"text_1": text_1, "text_2": text_2}, timeout=30)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["message"]
