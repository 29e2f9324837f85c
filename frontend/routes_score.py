"""Scoring handlers: TEI's /rerank and /predict, Cohere's, Jina's and vLLM's /v1/rerank and /v2/rerank,
vLLM's /score and /v1/score.

Each parses its API's request, asks the Service for scores (which chunks the pairs over the workers
like embeddings), and writes its API's answer. Rankings are by score, highest first; equal scores
keep their input order.
"""

from __future__ import annotations

import time
import uuid

from starlette.responses import Response

from quiver.frontend.errors import APIError
from quiver.frontend.http import Call, json_response
from quiver.frontend.schemas import CohereRerankRequest, PredictRequest, RerankRequest, ScoreRequest
from quiver.frontend.scores import ranking
from quiver.frontend.tokenization import TextInput


async def tei_rerank(call: Call) -> Response:
    req: RerankRequest = call.body
    result = await call.service.score(req.query, req.texts, route=call.spec.path, truncate=req.truncate,
                                      direction=req.truncation_direction, raw_scores=req.raw_scores,
                                      instruction=req.instruction, param="texts")
    ranks = []
    for index in ranking(result.values):
        rank = {"index": index, "score": float(result.values[index])}
        if req.return_text:
            rank["text"] = req.texts[index]
        ranks.append(rank)
    return json_response(ranks, headers=result.timings.headers())


async def rerank(call: Call) -> Response:
    """Cohere's and Jina's /v1/rerank, vLLM's and Cohere v2's /v2/rerank.

    Documents come back in the results when return_documents says so; without it, as each peer's
    default: not on /v1/rerank (Cohere's default), always on /v2/rerank (vLLM's, whose rerank answers
    every result with its document; Cohere's v2 client ignores the field).
    """
    req: CohereRerankRequest = call.body
    service = call.service
    service.check_model(req.model)
    texts = [doc if isinstance(doc, str) else doc.text for doc in req.documents]
    result = await service.score(req.query, texts, route=call.spec.path, truncate=req.truncate, direction="right",
                                 raw_scores=False, instruction=req.instruction, param="documents")
    order = ranking(result.values)
    if req.top_n:
        order = order[: req.top_n]
    with_documents = req.return_documents if req.return_documents is not None else call.spec.path == "/v2/rerank"
    results = []
    for index in order:
        item: dict = {"index": index, "relevance_score": float(result.values[index])}
        if with_documents:
            item["document"] = {"text": texts[index]}
        results.append(item)
    body = {"id": str(uuid.uuid4()), "model": service.model_name, "results": results,
            "usage": {"prompt_tokens": result.num_tokens, "total_tokens": result.num_tokens}}
    return json_response(body, headers=result.timings.headers())


def score_pairs(text_1: str | list[str], text_2: str | list[str]) -> tuple[str | list[str], list[str]]:
    """vLLM's pairing: 1:1 and 1:N score one text_1 against each text_2; N:N pairs them in order."""
    documents = [text_2] if isinstance(text_2, str) else text_2
    if isinstance(text_1, str):
        return text_1, documents
    if len(text_1) == 1:
        return text_1[0], documents
    if len(text_1) != len(documents):
        raise APIError("invalid_request",
                       f"text_1 holds {len(text_1)} texts and text_2 {len(documents)}; pairs are 1:1, 1:N or N:N",
                       param="text_1")
    return text_1, documents


async def vllm_score(call: Call) -> Response:
    req: ScoreRequest = call.body
    service = call.service
    service.check_model(req.model)
    if isinstance(req.text_1, list) and not req.text_1:
        raise APIError("empty_input", "'text_1' must not be empty", param="text_1")
    queries, documents = score_pairs(req.text_1, req.text_2)
    raw_scores = req.raw_scores or req.use_activation is False
    result = await service.score(queries, documents, route=call.spec.path, truncate=req.truncate, direction="right",
                                 raw_scores=raw_scores, instruction=req.instruction, param="text_2")
    body = {
        "id": f"score-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": service.model_name,
        "data": [{"index": i, "object": "score", "score": float(v)} for i, v in enumerate(result.values)],
        "usage": {"prompt_tokens": result.num_tokens, "total_tokens": result.num_tokens, "completion_tokens": 0},
    }
    return json_response(body, headers=result.timings.headers())


def predict_inputs(inputs: str | list[str | list[str]]) -> tuple[list[TextInput], bool]:
    """(texts or pairs, whether the request was a batch), by Text Embeddings Inference's rules.

    A string is one text and a list of exactly two strings one pair; any other list is a batch whose
    items are texts, pairs [a, b], or one-text lists [a].
    """
    if isinstance(inputs, str):
        return [inputs], False
    if len(inputs) == 2 and all(isinstance(item, str) for item in inputs):
        return [(inputs[0], inputs[1])], False
    items: list[TextInput] = []
    for index, item in enumerate(inputs):
        if isinstance(item, str):
            items.append(item)
        elif len(item) == 1:
            items.append(item[0])
        elif len(item) == 2:
            items.append((item[0], item[1]))
        else:
            raise APIError("validation", f"inputs.{index} holds {len(item)} texts; an input is a text or a pair [a, b]",
                           param="inputs")
    return items, True


async def tei_predict(call: Call) -> Response:
    req: PredictRequest = call.body
    service = call.service
    items, batched = predict_inputs(req.inputs)
    result = await service.classify(items, route=call.spec.path, truncate=req.truncate,
                                    direction=req.truncation_direction, raw_scores=req.raw_scores, param="inputs")
    labels = service.info.id2label
    predictions = [
        [{"score": float(row[i]), "label": labels.get(i, f"LABEL_{i}")} for i in ranking(row)]
        for row in result.values
    ]
    return json_response(predictions if batched else predictions[0], headers=result.timings.headers())
