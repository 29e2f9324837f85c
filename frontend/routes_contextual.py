"""Contextual chunk embeddings (late chunking): POST /v1/contextualizedembeddings, in the shape of
Perplexity's contextualized-embeddings API.

Each document is a list of chunks (strings, in document order). Every chunk is tokenized alone without
special tokens; the document is their concatenation, wrapped in the special tokens the tokenizer puts
around one text ("[CLS] … [SEP]" for BERT, nothing for pplx-embed's), and runs through the model once
as one sequence. Each chunk's vector is the mean of the final token states over its own tokens (the
document's special tokens belong to no chunk), then normalised as the model normalises, cut to
`dimensions` and written in `encoding_format`, as /v1/embeddings does. The worker returns every
token's state (the "tokens" task) and the frontend pools the spans, so the wire needs nothing beyond
token rows. A document longer than the model's context is refused (413), not truncated.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from pydantic import BaseModel, Field, StrictStr
from starlette.responses import Response

from quiver.common.model_info import KIND_EMBEDDING
from quiver.frontend.errors import APIError
from quiver.frontend.http import Call, json_response
from quiver.frontend.pipeline import Timings
from quiver.frontend.quantize import encode_rows
from quiver.frontend.schemas import MODEL_HELP, EncodingFormat, Request, Usage
from quiver.frontend.service import Service, matryoshka
from quiver.frontend.token_outputs import record_request, run_token_rows
from quiver.common.ragged import RaggedIds


class ContextualizedEmbeddingRequest(Request):
    """POST /v1/contextualizedembeddings, as Perplexity's contextualized-embeddings API."""

    input: list[list[StrictStr]] = Field(description="documents, each a list of its chunks in document order; "
                                                     "each chunk is embedded with its whole document as context")
    model: str | None = Field(None, description=MODEL_HELP)
    dimensions: int | None = Field(None, description="Matryoshka: keep the first N dimensions, renormalised")
    encoding_format: EncodingFormat = Field("float", description="as /v1/embeddings")


class ChunkEmbedding(BaseModel):
    object: str = "embedding"
    index: int
    embedding: list[float] | list[int] | str


class DocumentEmbeddings(BaseModel):
    object: str = "list"
    index: int
    data: list[ChunkEmbedding]


class ContextualizedEmbeddingResponse(BaseModel):
    object: str = "list"
    data: list[DocumentEmbeddings]
    model: str
    usage: Usage


def document_sequences(service: Service, documents: list[list[str]]) -> tuple[RaggedIds, list[np.ndarray]]:
    """One sequence per document, and each document's chunk lengths (in tokens)."""
    head, tail = service.tokenizer.wrapper_ids
    limit = service.info.max_input_length
    flat = [chunk for document in documents for chunk in document]
    encodings = iter(service.tokenizer.plain.encode_batch_fast(flat, add_special_tokens=False))
    ids: list[list[int]] = []
    chunk_lens = []
    for d, document in enumerate(documents):
        parts = [next(encodings).ids for _ in document]
        for c, part in enumerate(parts):
            if not part:
                raise APIError("empty_input", f"chunk {c} of document {d} has no tokens", param="input")
        tokens = head + [token for part in parts for token in part] + tail
        if len(tokens) > limit:
            raise APIError("body_too_large", f"document {d} has {len(tokens)} tokens, more than the model's context "
                           f"of {limit}; split it into several documents", param="input")
        ids.append(tokens)
        chunk_lens.append(np.array([len(part) for part in parts], dtype=np.int64))
    return RaggedIds.from_lists(ids), chunk_lens


def pool_chunks(rows: np.ndarray, head: int, chunk_lens: np.ndarray) -> np.ndarray:
    """Mean of one document's token rows over each chunk's span (after `head` special tokens)."""
    ends = head + np.cumsum(chunk_lens)
    sums = np.add.reduceat(rows[head:ends[-1]].astype(np.float64), (ends - chunk_lens - head).tolist(), axis=0)
    return (sums / chunk_lens[:, None]).astype(np.float32)


def check_request(service: Service, req: ContextualizedEmbeddingRequest) -> None:
    service.check_model(req.model)
    service.require_kind(KIND_EMBEDDING, "/v1/contextualizedembeddings")
    if service.info.pooling != "mean" or service.info.m3_heads:
        raise APIError("wrong_model_kind", f"contextual chunk embeddings pool each chunk's tokens by their mean; "
                       f"{service.model_name} pools by {service.info.pooling}, so its chunk vectors would not be "
                       "its own embeddings; use /v1/embeddings", param="input")
    service.check_count(len(req.input), "input")
    service.check_count(sum(len(document) for document in req.input), "input")
    for d, document in enumerate(req.input):
        if not document:
            raise APIError("empty_input", f"document {d} has no chunks", param="input")
        service.check_texts(document, "input")
    service.check_dimensions(req.dimensions)
    service.check_encoding_format(req.encoding_format)


async def contextualized_embeddings(call: Call) -> Response:
    req: ContextualizedEmbeddingRequest = call.body
    service = call.service
    timings = Timings(started=time.monotonic())
    check_request(service, req)
    chars = sum(len(chunk) for document in req.input for chunk in document)
    seqs, chunk_lens = await service.tokenizer.off_loop(chars, lambda: document_sequences(service, req.input))
    timings.tokenization_s = time.monotonic() - timings.started
    rows = await run_token_rows(service, seqs, timings)
    record_request(call.spec.path, seqs, timings, service.model_name)
    head = len(service.tokenizer.wrapper_ids[0])
    data: list[dict[str, Any]] = []
    for d, (start, length, lens) in enumerate(zip(seqs.offsets[:-1].tolist(), seqs.seq_lens.tolist(), chunk_lens)):
        vectors = pool_chunks(rows[start:start + length], head, lens)
        if service.info.normalize:
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
        vectors = matryoshka(vectors, req.dimensions, service.info.normalize)
        data.append({"object": "list", "index": d, "data": [
            {"object": "embedding", "index": j, "embedding": value}
            for j, value in enumerate(encode_rows(vectors, req.encoding_format))]})
    body = {"object": "list", "data": data, "model": service.model_name,
            "usage": {"prompt_tokens": seqs.num_tokens, "total_tokens": seqs.num_tokens}}
    return json_response(body, headers=timings.headers())
