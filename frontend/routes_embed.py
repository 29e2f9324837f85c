"""Embedding handlers: OpenAI's POST /v1/embeddings and Text Embeddings Inference's POST /embed."""

from __future__ import annotations

import functools
from typing import Any, Awaitable, Callable

import numpy as np
from starlette.responses import Response

from quiver.common.model_info import OUTPUT_DENSE
from quiver.frontend.http import Call, json_response
from quiver.frontend.long_inputs import embed_split
from quiver.frontend.quantize import encode_rows
from quiver.frontend.schemas import EmbeddingRequest, EmbedRequest
from quiver.frontend.service import Embeddings, Service


def _embed(call: Call, split_long_inputs: bool | None) -> Callable[..., Awaitable[Embeddings]]:
    """Service.embed, or the windowed embedding of long inputs when the request (else the server) asks."""
    split = call.service.settings.split_long_inputs if split_long_inputs is None else split_long_inputs
    return functools.partial(embed_split if split else Service.embed, call.service)


async def openai_embeddings(call: Call) -> Response:
    req: EmbeddingRequest = call.body
    if req.outputs is not None and set(req.outputs) != {OUTPUT_DENSE}:
        from quiver.frontend.routes_multi import openai_multi_embeddings

        return await openai_multi_embeddings(call)
    service = call.service
    service.check_model(req.model)
    result = await _embed(call, req.split_long_inputs)(
        req.input, route=call.spec.path, truncate=req.truncate, direction=req.truncation_direction,
        prompt_name=req.prompt_name, instruction=req.instruction, normalize=service.info.normalize,
        dimensions=req.dimensions, encoding_format=req.encoding_format, param="input",
    )
    body = openai_embeddings_body(result.rows, req.encoding_format, service.model_name, result.num_tokens)
    return json_response(body, headers=result.timings.headers())


def openai_embeddings_body(rows: np.ndarray, encoding_format: str, model: str, num_tokens: int) -> dict[str, Any]:
    """OpenAI's embeddings answer; each row stays a numpy array (or a base64 string) for the encoder."""
    data = [{"object": "embedding", "index": i, "embedding": value}
            for i, value in enumerate(encode_rows(rows, encoding_format))]
    return {"object": "list", "data": data, "model": model,
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}}


async def tei_embed(call: Call) -> Response:
    req: EmbedRequest = call.body
    result = await _embed(call, req.split_long_inputs)(
        req.inputs, route=call.spec.path, truncate=req.truncate, direction=req.truncation_direction,
        prompt_name=req.prompt_name, instruction=req.instruction, normalize=req.normalize,
        dimensions=req.dimensions, param="inputs",
    )
    return json_response(result.rows, headers=result.timings.headers())
