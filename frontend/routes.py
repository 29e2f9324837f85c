"""The route table: every route of the HTTP API, declared once.

Each RouteSpec names its path, method, request and response schemas, error style, whether it needs
the API key, and its handler. frontend/app.py builds the Starlette routes from ROUTES (each wrapped
in the request prologue of frontend/http.py), and frontend/openapi.py builds /openapi.json from the
same entries, so adding a route is one entry here (and its handler).
"""

from __future__ import annotations

import dataclasses

from starlette.responses import Response

from quiver.common.model_info import KIND_EMBEDDING, KIND_RERANKER
from quiver.frontend import (
    routes_contextual, routes_embed, routes_meta, routes_multi, routes_score, routes_sparse, schemas,
)
from quiver.frontend.errors import OPENAI, TEI
from quiver.frontend.http import Call, RouteSpec, json_response, parse

# Error statuses a route that runs the model can give beyond the prologue's (see openapi.STATUS_TEXT).
INFERENCE = (500, 503, 504)
TEI_INFERENCE = (424, *INFERENCE)

HEALTH_SCHEMA = {"type": "object", "properties": {"status": {"type": "string"}, "live_workers": {"type": "integer"}}}


async def openapi(call: Call) -> Response:
    return json_response(call.request.app.state.openapi)


EMBED = RouteSpec("/embed", "POST", "Embed inputs (Text Embeddings Inference-compatible)", routes_embed.tei_embed,
                  schemas.EmbedRequest, schemas.EMBED_RESPONSE_SCHEMA, TEI, statuses=TEI_INFERENCE)
RERANK = RouteSpec("/rerank", "POST", "Rank texts against a query (Text Embeddings Inference-compatible)",
                   routes_score.tei_rerank, schemas.RerankRequest, schemas.RERANK_RESPONSE_SCHEMA, TEI,
                   statuses=TEI_INFERENCE)
PREDICT = RouteSpec("/predict", "POST", "Classify texts or pairs (Text Embeddings Inference-compatible)",
                    routes_score.tei_predict, schemas.PredictRequest, schemas.PREDICT_RESPONSE_SCHEMA, TEI,
                    statuses=TEI_INFERENCE)


def tei_root_route(kind: str, num_labels: int) -> RouteSpec:
    """What TEI serves at / and /invocations for a model: embed for an embedder, rerank for a scorer
    (a reranker or a one-label cross-encoder), predict for a classifier."""
    if kind == KIND_EMBEDDING:
        return EMBED
    if kind == KIND_RERANKER or num_labels == 1:
        return RERANK
    return PREDICT


async def tei_root(call: Call) -> Response:
    info = call.service.info
    target = tei_root_route(info.kind, info.output_dim)
    assert target.request is not None
    return await target.handler(dataclasses.replace(call, body=parse(target.request, call.body, target.style),
                                                    spec=target))


def _tei_root(path: str) -> RouteSpec:
    one_of = [{"$ref": f"#/components/schemas/{route.request.__name__}"}
              for route in (EMBED, RERANK, PREDICT) if route.request is not None]
    responses = [EMBED.response, RERANK.response, PREDICT.response]
    return RouteSpec(path, "POST", "Embed, rerank or predict, by the model's kind (Text Embeddings Inference-"
                     "compatible): /embed's body for an embedder, /rerank's for a scorer, /predict's for a classifier",
                     tei_root, None, {"oneOf": responses}, TEI, statuses=TEI_INFERENCE,
                     request_schema={"oneOf": one_of})


def _rerank(path: str) -> RouteSpec:
    return RouteSpec(path, "POST", "Rank documents against a query (Cohere v1 / v2, Jina and vLLM-compatible)",
                     routes_score.rerank, schemas.CohereRerankRequest, schemas.CohereRerankResponse, OPENAI,
                     statuses=INFERENCE)


def _score(path: str) -> RouteSpec:
    return RouteSpec(path, "POST", "Score text pairs 1:1, 1:N or N:N (vLLM-compatible)", routes_score.vllm_score,
                     schemas.ScoreRequest, schemas.ScoreResponse, OPENAI, statuses=INFERENCE)


ROUTES: tuple[RouteSpec, ...] = (
    RouteSpec("/v1/embeddings", "POST", "Embed inputs (OpenAI-compatible)", routes_embed.openai_embeddings,
              schemas.EmbeddingRequest, schemas.EmbeddingResponse, OPENAI, statuses=INFERENCE),
    RouteSpec("/v1/contextualizedembeddings", "POST", "Embed each document's chunks with the whole document as "
              "context (late chunking; Perplexity-compatible)", routes_contextual.contextualized_embeddings,
              routes_contextual.ContextualizedEmbeddingRequest, routes_contextual.ContextualizedEmbeddingResponse,
              OPENAI, statuses=INFERENCE),
    EMBED,
    RERANK,
    _rerank("/v1/rerank"),
    _rerank("/v2/rerank"),
    _score("/score"),
    _score("/v1/score"),
    PREDICT,
    RouteSpec("/embed_sparse", "POST", "Sparse (SPLADE) embeddings, non-zeros per input (Text Embeddings "
              "Inference-compatible)", routes_sparse.tei_embed_sparse, routes_sparse.SparseEmbedRequest,
              routes_sparse.SPARSE_RESPONSE_SCHEMA, TEI, statuses=TEI_INFERENCE),
    RouteSpec("/embed_all", "POST", "Token vectors per input: BGE-M3's ColBERT vectors, else every token's final "
              "hidden state (Text Embeddings Inference-compatible)", routes_multi.tei_embed_all,
              routes_multi.EmbedAllRequest, routes_multi.EMBED_ALL_RESPONSE_SCHEMA, TEI, statuses=TEI_INFERENCE),
    _tei_root("/"),
    _tei_root("/invocations"),
    RouteSpec("/tokenize", "POST", "Tokenize inputs", routes_meta.tokenize, schemas.TokenizeRequest,
              schemas.TOKENIZE_RESPONSE_SCHEMA, TEI, statuses=(500,)),
    RouteSpec("/v1/models", "GET", "The served model under each of its names (OpenAI-compatible)",
              routes_meta.models, None, schemas.ModelList, OPENAI),
    RouteSpec("/info", "GET", "Model and server facts", routes_meta.info, None, schemas.Info, TEI),
    RouteSpec("/health", "GET", "200 while at least one worker is live, else 503", routes_meta.health, None,
              HEALTH_SCHEMA, TEI, public=True, statuses=(503,)),
    RouteSpec("/metrics", "GET", "Prometheus metrics", routes_meta.prometheus_metrics, None, {"type": "string"},
              TEI, public=True, media_type="text/plain"),
    RouteSpec("/openapi.json", "GET", "This document", openapi, None, {"type": "object"}, TEI),
)
