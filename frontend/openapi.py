"""The OpenAPI 3.1 document of the route table, built from the pydantic schemas."""

from __future__ import annotations

from typing import Any, Iterable

from pydantic import BaseModel

from quiver.common.version import __version__
from quiver.frontend import schemas
from quiver.frontend.errors import OPENAI
from quiver.frontend.http import RouteSpec

STATUS_TEXT = {
    400: "malformed request, an over-long input (OpenAI-style routes), or a route that does not fit the model's kind",
    401: "missing or wrong API key",
    404: "no such object (an unknown or another key's file or batch) or model",
    408: "the request body did not arrive in time",
    413: "body, batch or answer too large",
    415: "the body is not sent as application/json",
    421: "a Host header other than localhost while the server listens on loopback",
    422: "invalid input",
    424: "the model cannot serve this route (Text Embeddings Inference's status)",
    429: "overloaded; retry after the Retry-After header's seconds",
    500: "internal error",
    503: "no worker is live",
    504: "the request's deadline passed",
}
PROLOGUE_STATUSES = (421,)  # every route: the Host check
KEY_STATUSES = (401,)
BODY_STATUSES = (400, 408, 413, 415, 422, 429)


def error_statuses(spec: RouteSpec) -> list[int]:
    """Every error status the route can give: its prologue's and its handler's."""
    codes = set(PROLOGUE_STATUSES) | set(spec.statuses)
    if not spec.public:
        codes |= set(KEY_STATUSES)
    if spec.request is not None or spec.request_schema is not None:
        codes |= set(BODY_STATUSES)
    return sorted(codes)


def _ref(model: type[BaseModel], components: dict[str, Any]) -> dict[str, str]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, definition in schema.pop("$defs", {}).items():
        components[name] = definition
    components[model.__name__] = schema
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _schema(spec: Any, components: dict[str, Any]) -> dict[str, Any]:
    if isinstance(spec, type) and issubclass(spec, BaseModel):
        return _ref(spec, components)
    return spec


def build_openapi(routes: Iterable[RouteSpec], keyed: bool) -> dict[str, Any]:
    """The document; `keyed`: the server requires an API key on every route not marked public."""
    components: dict[str, Any] = {}
    for referenced in (schemas.SimpleToken, schemas.Rank, schemas.Prediction):
        _ref(referenced, components)
    routes = list(routes)
    for route in routes:  # request models first, so that a route may refer to another's
        if route.request is not None:
            _ref(route.request, components)
    paths: dict[str, Any] = {}
    for route in routes:
        error_ref = _schema(schemas.OpenAIError if route.style == OPENAI else schemas.TEIError, components)
        operation: dict[str, Any] = {
            "summary": route.summary,
            "responses": {"200": {"description": "OK",
                                  "content": {route.media_type: {"schema": _schema(route.response, components)}}}},
        }
        if keyed:
            operation["security"] = [] if route.public else [{"bearer": []}]
        for status in error_statuses(route):
            operation["responses"][str(status)] = {"description": STATUS_TEXT[status],
                                                   "content": {"application/json": {"schema": error_ref}}}
        request = _schema(route.request, components) if route.request is not None else route.request_schema
        if request is not None:
            operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": request}}}
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "Quiver", "version": __version__,
                 "description": "Text embeddings and relevance scores, served from GPUs."},
        "paths": paths,
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
