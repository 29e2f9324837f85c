"""The warm-up's requests for each kind of model, and its in-process call of an ASGI app."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from quiver.common.model_info import KIND_CLASSIFIER, KIND_EMBEDDING, KIND_RERANKER, KIND_SPARSE
from quiver.frontend.warmup import TEXT_WORDS, WarmupRequest, call_app, requests_for, text_of


def service_of(kind: str, max_input_length: int = 512, vocab_size: int = 30522) -> Any:
    info = SimpleNamespace(kind=kind, max_input_length=max_input_length, vocab_size=vocab_size)
    return SimpleNamespace(info=info, model_name="the-model")


def test_texts_keep_within_half_the_model_limit() -> None:
    assert len(text_of(480, 128).split()) == 60
    assert len(text_of(8, 128).split()) == 8
    assert len(text_of(480, 8192).split()) == 480
    assert len(text_of(480, 4).split()) == 1


def test_an_embedding_model_is_warmed_with_texts_and_token_ids_on_both_apis() -> None:
    requests = requests_for(service_of(KIND_EMBEDDING, vocab_size=50))
    assert [r.path for r in requests] == ["/v1/embeddings"] * 6 + ["/embed"] * 3
    ids = [r.body["input"][0] for r in requests[3:6]]
    assert [len(row) for row in ids] == [len(text_of(words, 512).split()) for words in TEXT_WORDS]
    assert all(0 < i < 50 for row in ids for i in row)
    assert all(r.body["model"] == "the-model" for r in requests)


def test_each_kind_is_warmed_on_the_route_it_answers() -> None:
    assert {r.path for r in requests_for(service_of(KIND_SPARSE))} == {"/embed_sparse"}
    assert {r.path for r in requests_for(service_of(KIND_CLASSIFIER))} == {"/predict"}
    rerank = requests_for(service_of(KIND_RERANKER))
    assert {r.path for r in rerank} == {"/rerank"} and all(len(r.body["texts"]) == 2 for r in rerank)


def test_call_app_posts_the_body_and_returns_the_answer() -> None:
    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"got": orjson.loads(await request.body()), "auth": request.headers.get("authorization"),
                             "type": request.headers.get("content-type")}, status_code=201)

    app = Starlette(routes=[Route("/echo", echo, methods=["POST"])])
    status, body = asyncio.run(call_app(app, WarmupRequest("/echo", {"a": 1}), [(b"authorization", b"Bearer k")]))
    assert status == 201
    assert orjson.loads(body) == {"got": {"a": 1}, "auth": "Bearer k", "type": "application/json"}
