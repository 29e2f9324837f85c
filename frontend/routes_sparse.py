"""Sparse embeddings: Text Embeddings Inference's POST /embed_sparse, for SPLADE and BGE-M3 models.

A SPLADE model (*ForMaskedLM encoder) gives each input one weight per vocabulary entry, mostly zero.
Workers ship only the non-zeros (see common.protocol.Result); the answer lists them per input as
`[{index, value}]`, ascending by index, as Text Embeddings Inference does. BGE-M3's lexical weights come
from its token rows instead (frontend/token_outputs.py), indexed by token id the same way.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from starlette.responses import Response

from quiver.common.model_info import KIND_SPARSE
from quiver.common.protocol import TASK_EMBED, Result
from quiver.frontend import metrics
from quiver.frontend.errors import APIError
from quiver.frontend.http import Call, json_response
from quiver.frontend.pipeline import Timings
from quiver.frontend.schemas import TeiInputsRequest
from quiver.frontend.service import ROUTES_BY_KIND, Service, describe, record_stages
from quiver.frontend.token_outputs import M3Outputs, token_rows


class SparseEmbedRequest(TeiInputsRequest):
    """POST /embed_sparse, as Text Embeddings Inference."""


SPARSE_RESPONSE_SCHEMA = {"type": "array", "items": {"type": "array", "items": {
    "type": "object", "properties": {"index": {"type": "integer"}, "value": {"type": "number"}},
    "required": ["index", "value"]}}}

def result_rows(result: Result) -> list[tuple[np.ndarray, np.ndarray]]:
    """(indices, values) of each row's non-zeros, from a sparse result or a dense one."""
    if result.nnz is not None:
        return result.sparse_rows()
    return [(np.flatnonzero(row), row[row != 0]) for row in result.values]


async def sparse_embed(service: Service, inputs: object, *, route: str, truncate: bool | None, direction: str,
                       prompt_name: str | None, instruction: str | None,
                       param: str) -> tuple[list[tuple[np.ndarray, np.ndarray]], int, Timings]:
    """Each input's non-zero weights (indices ascending), its token count, and the stage timings."""
    if service.info.m3_heads:
        rows = await token_rows(service, inputs, route=route, truncate=truncate, direction=direction,
                                prompt_name=prompt_name, instruction=instruction, param=param,
                                returns_vectors=False, lexical_only=True)
        return M3Outputs(service, rows).sparse, rows.num_tokens, rows.timings
    timings = Timings(started=time.monotonic())
    if service.info.kind != KIND_SPARSE:
        raise APIError("wrong_model_kind",
                       f"{route} needs a sparse model (SPLADE, or BGE-M3 with its sparse head); this server runs "
                       f"{service.model_name}, {describe(service.info)}, which serves {ROUTES_BY_KIND[service.info.kind]}")
    seqs = await service.tokenize(inputs, truncate, direction, prompt_name, param, timings, instruction)
    metrics.INPUT_TOKENS_BY[route].observe(seqs.num_tokens)
    metrics.INPUTS_BY[route].observe(seqs.num_seqs)
    results = await service.pipeline.run_results(seqs, TASK_EMBED, False, timings)
    record_stages(route, timings, service.model_name)
    return [row for result in results for row in result_rows(result)], seqs.num_tokens, timings


def as_index_values(indices: np.ndarray, values: np.ndarray) -> list[dict[str, Any]]:
    return [{"index": i, "value": v} for i, v in zip(indices.tolist(), values.tolist())]


async def tei_embed_sparse(call: Call) -> Response:
    req: SparseEmbedRequest = call.body
    rows, _, timings = await sparse_embed(
        call.service, req.inputs, route=call.spec.path, truncate=req.truncate, direction=req.truncation_direction,
        prompt_name=req.prompt_name, instruction=req.instruction, param="inputs")
    return json_response([as_index_values(indices, values) for indices, values in rows], headers=timings.headers())
