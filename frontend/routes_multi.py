"""Routes for outputs beyond one dense vector per input, made from token rows (frontend/token_outputs.py):
Text Embeddings Inference's POST /embed_all, and the `outputs` extension of POST /v1/embeddings.

/embed_all answers, per input, a list of token vectors: for BGE-M3 its ColBERT vectors (every token but
the first, normalised), for other embedders the final hidden state of every token, as TEI does.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from quiver.common.model_info import OUTPUT_COLBERT, OUTPUT_DENSE, OUTPUT_SPARSE
from quiver.frontend.errors import APIError
from quiver.frontend.http import Call, json_response
from quiver.frontend.quantize import encode_rows
from quiver.frontend.schemas import (
    EmbeddingRequest,
)
from quiver.frontend.schemas import TeiInputsRequest
from quiver.frontend.service import Service, matryoshka
from quiver.frontend.token_outputs import M3Outputs, token_rows


class EmbedAllRequest(TeiInputsRequest):
    """POST /embed_all, as Text Embeddings Inference."""


EMBED_ALL_RESPONSE_SCHEMA = {"type": "array", "items": {"type": "array", "items": {
    "type": "array", "items": {"type": "number"}}}}


async def tei_embed_all(call: Call) -> Response:
    req: EmbedAllRequest = call.body
    service = call.service
    rows = await token_rows(service, req.inputs, route=call.spec.path, truncate=req.truncate,
                            direction=req.truncation_direction, prompt_name=req.prompt_name,
                            instruction=req.instruction, param="inputs")
    if service.info.m3_heads:
        body = M3Outputs(service, rows).colbert
    else:
        body = rows.rows
    return json_response(body, headers=rows.timings.headers())


def check_outputs(service: Service, req: EmbeddingRequest) -> None:
    """A request for outputs the model lacks, or with options that do not apply to them, is refused."""
    assert req.outputs is not None
    missing = [name for name in req.outputs if name not in service.info.outputs]
    if missing:
        raise APIError("invalid_request", f"{service.model_name} gives {', '.join(service.info.outputs) or 'no'} "
                       f"outputs, not {', '.join(missing)}; sparse and colbert come from BGE-M3 checkpoints "
                       "(sparse_linear.pt and colbert_linear.pt beside the model)", param="outputs")
    if req.split_long_inputs:
        raise APIError("invalid_request", "split_long_inputs applies to dense vectors only; leave it out with "
                       "outputs", param="split_long_inputs")
    service.check_dimensions(req.dimensions)
    service.check_encoding_format(req.encoding_format)


async def openai_multi_embeddings(call: Call) -> Response:
    """/v1/embeddings with `outputs`: each of the asked outputs per input, from one forward pass."""
    req: EmbeddingRequest = call.body
    service = call.service
    service.check_model(req.model)
    check_outputs(service, req)
    rows = await token_rows(service, req.input, route=call.spec.path, truncate=req.truncate,
                            direction=req.truncation_direction, prompt_name=req.prompt_name,
                            instruction=req.instruction, param="input",
                            returns_vectors=OUTPUT_COLBERT in (req.outputs or ()),
                            lexical_only=set(req.outputs or ()) == {OUTPUT_SPARSE})
    outputs = M3Outputs(service, rows)
    wanted = set(req.outputs or ())
    data: list[dict[str, Any]] = [{"object": "embedding", "index": i} for i in range(len(rows.rows))]
    if OUTPUT_DENSE in wanted:
        dense = encode_rows(matryoshka(outputs.dense, req.dimensions, True), req.encoding_format)
        for item, vector in zip(data, dense):
            item["embedding"] = vector
    if OUTPUT_SPARSE in wanted:
        for item, (ids, weights) in zip(data, outputs.sparse):
            item["sparse_embedding"] = [{"index": i, "value": v} for i, v in zip(ids.tolist(), weights.tolist())]
    if OUTPUT_COLBERT in wanted:
        for item, vectors in zip(data, outputs.colbert):
            item["colbert_embedding"] = encode_rows(vectors, req.encoding_format)
    body = {"object": "list", "data": data, "model": service.model_name,
            "usage": {"prompt_tokens": rows.num_tokens, "total_tokens": rows.num_tokens}}
    return json_response(body, headers=rows.timings.headers())
