"""The route table is the one declaration of each route; the app and /openapi.json
are built from it and agree with it."""

from __future__ import annotations

from collections import Counter

import httpx

from quiver.frontend.openapi import build_openapi, error_statuses
from quiver.frontend.routes import ROUTES
from quiver.jobs.routes import ROUTES as BATCH_ROUTES


def test_each_route_is_declared_once():
    counts = Counter((spec.path, spec.method) for spec in ROUTES)
    assert [key for key, count in counts.items() if count > 1] == []


def test_the_served_app_and_its_document_follow_the_table(cluster):
    """The served document is the table's, plus the routes of the installed extension (the Batch API)."""
    document = httpx.get(cluster.url + "/openapi.json", timeout=10).json()
    expected = build_openapi(ROUTES, keyed=False)
    assert {path: document["paths"][path] for path in expected["paths"]} == expected["paths"]
    assert document["components"] == expected["components"]
    assert {(path, method.upper()) for path, ops in document["paths"].items() for method in ops} == \
        {(spec.path, spec.method) for spec in ROUTES} | {(path, method) for path, method, _ in BATCH_ROUTES}
    for spec in ROUTES:
        statuses = set(document["paths"][spec.path][spec.method.lower()]["responses"])
        assert statuses == {"200", *map(str, error_statuses(spec))}, spec.path
        # Every declared route is served: a wrong method is 405, never 404.
        other = "GET" if spec.method == "POST" else "POST"
        assert httpx.request(other, cluster.url + spec.path, timeout=10).status_code == 405, spec.path


def test_public_routes_are_only_the_probes():
    assert {spec.path for spec in ROUTES if spec.public} == {"/health", "/metrics"}
