"""/openapi.json needs the key when one is set; bodies are JSON only (415 for the
content types cross-site forms use); a server bound to loopback answers only loopback Host names."""

from __future__ import annotations

import httpx
import pytest

from tests.frontend.test_errors import openai_error, tei_error


def test_openapi_needs_the_key_and_probes_do_not(cluster):
    _, url = cluster.extra_frontend(["--api-key", "s3cret"])
    tei_error(httpx.get(url + "/openapi.json", timeout=10), 401, "Unauthorized")
    keyed = httpx.get(url + "/openapi.json", headers={"Authorization": "Bearer s3cret"}, timeout=10)
    assert keyed.status_code == 200 and "/v1/embeddings" in keyed.json()["paths"]
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    assert httpx.get(url + "/metrics", timeout=10).status_code == 200
    openai_error(httpx.get(url + "/v1/models", timeout=10), 401, "unauthorized")


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "text/html"])
def test_bodies_that_are_not_json_typed_get_415(cluster, content_type):
    headers = {"Content-Type": content_type}
    tei = httpx.post(cluster.url + "/embed", content=b'{"inputs": "x"}', headers=headers, timeout=10)
    assert "application/json" in tei_error(tei, 415, "Validation")["error"]
    openai = httpx.post(cluster.url + "/v1/embeddings", content=b'{"input": "x"}', headers=headers, timeout=10)
    openai_error(openai, 415, "unsupported_media_type")


@pytest.mark.parametrize("content_type", ["application/json", "application/json; charset=utf-8",
                                          "Application/JSON", None])
def test_json_with_or_without_a_charset_or_no_type_is_served(cluster, content_type):
    headers = {"Content-Type": content_type} if content_type else {}
    response = httpx.post(cluster.url + "/embed", content=b'{"inputs": "x"}', headers=headers, timeout=30)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "192.168.1.20", "localhost.evil.example"])
def test_a_foreign_host_header_is_refused_on_loopback(cluster, host):
    response = httpx.post(cluster.url + "/embed", json={"inputs": "x"}, headers={"Host": host}, timeout=10)
    assert "Host" in tei_error(response, 421, "Validation")["error"]
    openai = httpx.get(cluster.url + "/v1/models", headers={"Host": host}, timeout=10)
    openai_error(openai, 421, "misdirected")


@pytest.mark.parametrize("host", ["localhost", "localhost:1234", "127.0.0.1", "127.0.0.1:80", "[::1]", "[::1]:8080"])
def test_loopback_host_names_are_served(cluster, host):
    response = httpx.post(cluster.url + "/embed", json={"inputs": "x"}, headers={"Host": host}, timeout=30)
    assert response.status_code == 200, response.text


def test_a_server_on_every_address_does_not_check_the_host(cluster):
    _, url = cluster.extra_frontend(["--host", "0.0.0.0"])
    response = httpx.post(url + "/embed", json={"inputs": "x"}, headers={"Host": "embeddings.example"}, timeout=30)
    assert response.status_code == 200, response.text
