"""Fuzz every route of the OpenAPI document with hypothesis: any body gets a 2xx or 4xx, never a 5xx,
and the server stays healthy."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**40, 2**40),
                         st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=40))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=6), st.dictionaries(st.text(max_size=12), inner, max_size=6)), max_leaves=20)
token_ids = st.lists(st.integers(-5, 40000), max_size=20)
inputs = st.one_of(st.text(max_size=200), st.lists(st.text(max_size=60), max_size=6), token_ids,
                   st.lists(token_ids, max_size=4), json_values)

# Bodies shaped like each route's schema, with every field free to be wrong.
FIELDS = {
    "input": inputs, "inputs": inputs, "model": st.one_of(st.none(), st.text(max_size=20)),
    "encoding_format": st.sampled_from(["float", "base64", "int8", "binary", "ubinary", "bogus", 3]),
    "dimensions": st.one_of(st.none(), st.integers(-3, 1000), st.text(max_size=3)),
    "normalize": json_scalars, "truncate": json_scalars,
    "truncation_direction": st.sampled_from(["left", "right", "Left", "Right", "up", None, 1]),
    "prompt_name": st.one_of(st.none(), st.text(max_size=10)), "add_special_tokens": json_scalars,
    "query": inputs, "texts": inputs, "documents": inputs, "text_1": inputs, "text_2": inputs,
    "top_n": st.one_of(st.none(), st.integers(-3, 50)), "raw_scores": json_scalars, "return_text": json_scalars,
    "return_documents": json_scalars, "user": json_scalars,
}
shaped_bodies = st.fixed_dictionaries({}, optional=FIELDS)
bodies = st.one_of(shaped_bodies, json_values)


def post_routes(cluster) -> list[str]:
    document = httpx.get(cluster.url + "/openapi.json", timeout=10).json()
    return [path for path, ops in document["paths"].items() if "post" in ops]


@pytest.fixture(scope="module")
def routes(cluster):
    found = post_routes(cluster)
    assert {"/v1/embeddings", "/embed", "/tokenize"} <= set(found)
    return found


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), body=bodies)
def test_no_body_gets_a_5xx(cluster, routes, data, body):
    route = data.draw(st.sampled_from(routes))
    response = httpx.post(cluster.url + route, json=body, timeout=60)
    assert response.status_code < 500, (route, body, response.status_code, response.text[:300])
    assert response.headers["content-type"].startswith("application/json")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), raw=st.binary(max_size=300))
def test_no_raw_bytes_get_a_5xx(cluster, routes, data, raw):
    route = data.draw(st.sampled_from(routes))
    response = httpx.post(cluster.url + route, content=raw, timeout=60)
    assert response.status_code < 500, (route, raw, response.status_code, response.text[:300])


def test_still_healthy_after_the_fuzz(cluster):
    assert httpx.get(cluster.url + "/health", timeout=5).status_code == 200
    assert httpx.post(cluster.url + "/embed", json={"inputs": "alive"}, timeout=30).status_code == 200
    assert all(p.alive() for p in cluster.processes())
