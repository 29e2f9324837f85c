"""The OpenAPI 3.1 document of every route, built from the pydantic schemas."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from quiver.common.version import __version__
from quiver.frontend import schemas

# path -> (method, summary, request model or None, response schema, error model)
ROUTES: dict[str, tuple[str, str, type[BaseModel] | None, Any, type[BaseModel]]] = {
    "/v1/embeddings": ("post", "Embed inputs (OpenAI-compatible)", schemas.EmbeddingRequest,
                       schemas.EmbeddingResponse, schemas.OpenAIError),
    "/embed": ("post", "Embed inputs (Text Embeddings Inference-compatible)", schemas.EmbedRequest,
               schemas.EMBED_RESPONSE_SCHEMA, schemas.TEIError),
    "/rerank": ("post", "Rank texts against a query (Text Embeddings Inference-compatible)", schemas.RerankRequest,
                schemas.RERANK_RESPONSE_SCHEMA, schemas.TEIError),
    "/v1/rerank": ("post", "Rank documents against a query (Cohere / Jina-compatible)", schemas.CohereRerankRequest,
                   schemas.CohereRerankResponse, schemas.OpenAIError),
    "/score": ("post", "Score text pairs 1:1, 1:N or N:N (vLLM-compatible)", schemas.ScoreRequest,
               schemas.ScoreResponse, schemas.OpenAIError),
    "/predict": ("post", "Classify texts or pairs (Text Embeddings Inference-compatible)", schemas.PredictRequest,
                 schemas.PREDICT_RESPONSE_SCHEMA, schemas.TEIError),
    "/tokenize": ("post", "Tokenize inputs", schemas.TokenizeRequest, schemas.TOKENIZE_RESPONSE_SCHEMA,
                  schemas.TEIError),
    "/info": ("get", "Model and server facts", None, schemas.Info, schemas.TEIError),
    "/health": ("get", "200 while at least one worker is live, else 503", None,
                {"type": "object", "properties": {"status": {"type": "string"}, "live_workers": {"type": "integer"}}},
                schemas.TEIError),
    "/metrics": ("get", "Prometheus metrics", None, {"type": "string"}, schemas.TEIError),
}

ERROR_STATUSES = {
    "400": "malformed request, or a route that does not fit the model's kind", "401": "missing or wrong API key",
    "413": "body or batch too large",
    "422": "invalid input", "429": "overloaded; retry after the Retry-After header's seconds",
    "500": "internal error", "503": "no worker is live", "504": "the request's deadline passed",
}


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


def build_openapi(extra_routes: dict[str, tuple] | None = None) -> dict[str, Any]:
    components: dict[str, Any] = {}
    for referenced in (schemas.SimpleToken, schemas.Rank, schemas.Prediction):
        _ref(referenced, components)
    paths: dict[str, Any] = {}
    for path, (method, summary, request, response, error) in {**ROUTES, **(extra_routes or {})}.items():
        media = "text/plain" if path == "/metrics" else "application/json"
        error_ref = _schema(error, components)
        operation: dict[str, Any] = {
            "summary": summary,
            "responses": {"200": {"description": "OK", "content": {media: {"schema": _schema(response, components)}}}},
        }
        for status, description in ERROR_STATUSES.items():
            operation["responses"][status] = {"description": description,
                                              "content": {"application/json": {"schema": error_ref}}}
        if request is not None:
            operation["requestBody"] = {"required": True,
                                        "content": {"application/json": {"schema": _schema(request, components)}}}
        paths[path] = {method: operation}
    return {
        "openapi": "3.1.0",
        "info": {"title": "Quiver", "version": __version__,
                 "description": "Text embeddings and relevance scores, served from GPUs."},
        "paths": paths,
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
