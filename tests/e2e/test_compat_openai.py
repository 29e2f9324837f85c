"""With the real `openai` client: GET /v1/models, any `model` accepted with one
model served (counted) unless --strict-model-name, aliases from --served-model-name, an over-long
input answered 400 as OpenAI does; /openapi.json lists for the probes only the statuses they give."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest

from tests.security.test_http_client_mistakes import counter


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_models_list_names_the_served_model(cluster):
    models = client(cluster.url).models.list()
    info = httpx.get(cluster.url + "/info", timeout=10).json()
    assert [model.id for model in models.data] == [info["model_id"]]
    assert models.data[0].object == "model" and models.data[0].owned_by == "quiver"


def test_any_model_name_is_served_and_counted(cluster, st_model):
    before = counter(httpx.get(cluster.url + "/metrics", timeout=10).text, "quiver_frontend_other_model_names_total")
    texts = ["a cat sleeps on the sofa", "the stock market fell"]
    response = client(cluster.url).embeddings.create(model="text-embedding-3-small", input=texts)
    served = np.array([item.embedding for item in response.data])
    expected = st_model.encode(texts, normalize_embeddings=True)
    cosine = (served * expected).sum(axis=1) / np.linalg.norm(served, axis=1) / np.linalg.norm(expected, axis=1)
    assert cosine.min() > 0.999
    after = counter(httpx.get(cluster.url + "/metrics", timeout=10).text, "quiver_frontend_other_model_names_total")
    assert after == before + 1


def test_aliases_and_strict_model_name(cluster):
    _, url = cluster.extra_frontend(["--served-model-name", "minilm, all-minilm", "--strict-model-name"])
    api = client(url)
    assert [model.id for model in api.models.list().data] == ["minilm", "all-minilm"]
    for name in ("minilm", "all-minilm"):
        assert api.embeddings.create(model=name, input="x").model == "minilm"
    with pytest.raises(openai.NotFoundError) as refused:
        api.embeddings.create(model="text-embedding-3-small", input="x")
    assert "minilm" in str(refused.value)


def test_an_over_long_input_is_a_400_bad_request(cluster):
    with pytest.raises(openai.BadRequestError) as refused:
        client(cluster.url).embeddings.create(model="any", input="word " * 400)
    assert refused.value.code == "input_too_long"
    tei = httpx.post(cluster.url + "/embed", json={"inputs": "word " * 400}, timeout=30)
    assert tei.status_code == 422 and tei.json()["error_type"] == "Validation"


def test_openapi_lists_only_the_statuses_each_probe_gives(cluster):
    paths = httpx.get(cluster.url + "/openapi.json", timeout=10).json()["paths"]
    assert set(paths["/health"]["get"]["responses"]) == {"200", "421", "503"}
    assert set(paths["/metrics"]["get"]["responses"]) == {"200", "421"}
    assert {"401", "413", "415", "429"} <= set(paths["/v1/embeddings"]["post"]["responses"])
    assert "get" in paths["/v1/models"] and "post" in paths["/"] and "post" in paths["/invocations"]
