"""Embedding routes: OpenAI's POST /v1/embeddings and Text Embeddings Inference's POST /embed."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from quiver.frontend.http import json_response, parse, read_json
from quiver.frontend.long_inputs import embed_split
from quiver.frontend.quantize import encode_rows
from quiver.frontend.schemas import EmbeddingRequest, EmbedRequest
from quiver.frontend.service import Service


def openai_embeddings(service: Service):
    route = "/v1/embeddings"

    async def handler(request: Request) -> Response:
        req: EmbeddingRequest = parse(EmbeddingRequest, await read_json(request, service.settings.max_body_bytes), True)
        service.check_model(req.model)
        split = service.settings.split_long_inputs if req.split_long_inputs is None else req.split_long_inputs
        result = await (embed_split if split else Service.embed)(
            service, req.input, route=route, truncate=req.truncate, direction=req.truncation_direction,
            prompt_name=req.prompt_name, instruction=req.instruction, normalize=service.info.normalize,
            dimensions=req.dimensions, encoding_format=req.encoding_format, param="input",
        )
        data = [{"object": "embedding", "index": i, "embedding": value}
                for i, value in enumerate(encode_rows(result.rows, req.encoding_format))]
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
        split = service.settings.split_long_inputs if req.split_long_inputs is None else req.split_long_inputs
        result = await (embed_split if split else Service.embed)(
            service, req.inputs, route=route, truncate=req.truncate, direction=req.truncation_direction,
            prompt_name=req.prompt_name, instruction=req.instruction, normalize=req.normalize,
            dimensions=req.dimensions, param="inputs",
        )
        return json_response(result.rows, headers=result.timings.headers())

    return route, handler
