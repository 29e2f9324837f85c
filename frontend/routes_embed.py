"""Embedding routes: OpenAI's POST /v1/embeddings and Text Embeddings Inference's POST /embed."""

from __future__ import annotations

import base64

from starlette.requests import Request
from starlette.responses import Response

from frontend import metrics
from frontend.errors import APIError
from frontend.http import json_response, parse, read_json
from frontend.pipeline import Timings
from frontend.schemas import EmbeddingRequest, EmbedRequest
from frontend.service import Service


def _record(route: str, timings: Timings) -> None:
    for stage, seconds in (("tokenization", timings.tokenization_s), ("queue", timings.queue_s),
                           ("inference", timings.inference_s)):
        metrics.STAGE_SECONDS.labels(route, stage).observe(seconds)


def openai_embeddings(service: Service):
    route = "/v1/embeddings"

    async def handler(request: Request) -> Response:
        req: EmbeddingRequest = parse(EmbeddingRequest, await read_json(request, service.settings.max_body_bytes), True)
        if req.model and req.model not in (service.model_name, service.info.path.name):
            raise APIError("not_found", f"the model {req.model!r} does not exist; this server runs {service.model_name!r}",
                           param="model")
        result = await service.embed(
            req.input, route=route, truncate=req.truncate, direction=req.truncation_direction, prompt_name=None,
            normalize=service.info.normalize, dimensions=req.dimensions, param="input",
        )
        _record(route, result.timings)
        if req.encoding_format == "base64":
            data = [{"object": "embedding", "index": i, "embedding": base64.b64encode(row.tobytes()).decode("ascii")}
                    for i, row in enumerate(result.rows)]
        else:
            data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(result.rows)]
        body = {
            "object": "list",
            "data": data,
            "model": service.model_name,
            "usage": {"prompt_tokens": result.num_tokens, "total_tokens": result.num_tokens},
        }
        return json_response(body, headers=result.timings.headers())

    return route, handler


def tei_embed(service: Service):
    route = "/embed"

    async def handler(request: Request) -> Response:
        req: EmbedRequest = parse(EmbedRequest, await read_json(request, service.settings.max_body_bytes), False)
        result = await service.embed(
            req.inputs, route=route, truncate=req.truncate, direction=req.truncation_direction,
            prompt_name=req.prompt_name, normalize=req.normalize, dimensions=req.dimensions, param="inputs",
        )
        _record(route, result.timings)
        return json_response(result.rows, headers=result.timings.headers())

    return route, handler
