"""One part of a batch's input file, executed through the frontend's Service: lines in, result lines out.

Each line is parsed and validated on its own, so a corrupt or invalid line becomes one line of the
error file and nothing else. Embedding lines are tokenized one by one (the same checks as
POST /v1/embeddings) and then sent to the workers together, in pipeline runs bounded by tokens, so
a part of short lines costs a few large chunks rather than many small ones. Scoring lines
(/v1/rerank, /score) each go through Service.score. Failures of the serving path itself (no worker,
overloaded, deadline) are not the line's fault: they raise Transient and the part is run again later.

The per-line work runs on the frontend's event loop, beside online requests: it calls `pace()` before
each line, which lets it go on only in short slices (see Runner._pace).
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import orjson

from quiver.common.protocol import TASK_EMBED
from quiver.common.ragged import RaggedIds
from quiver.frontend import metrics
from quiver.frontend.errors import OPENAI, status_of, REASONS, APIError
from quiver.frontend.http import parse
from quiver.frontend.pipeline import Timings
from quiver.frontend.quantize import encode_rows
from quiver.frontend.routes_score import score_pairs
from quiver.frontend.schemas import CohereRerankRequest, EmbeddingRequest, ScoreRequest
from quiver.frontend.scores import ranking
from quiver.frontend.service import Service, matryoshka
from quiver.jobs.store import ResultLine

EMBEDDINGS = "/v1/embeddings"
ENDPOINTS = (EMBEDDINGS, "/v1/rerank", "/score")
BATCH_ROUTE = "batch"  # the route label of failed batch lines in quiver_frontend's failure counter
TRANSIENT_REASONS = frozenset({"overloaded", "unavailable", "timeout", "internal"})

# Reserve(tokens) waits until the runner may put that many more tokens in flight; Release(tokens) frees them.
Reserve = Callable[[int], Awaitable[None]]
Release = Callable[[int], None]
Pace = Callable[[], Awaitable[None]]  # returns when the runner may spend the event loop on one more line


class Transient(Exception):
    """The serving path could not take the work right now; nothing of the part is committed."""


@dataclass
class Line:
    number: int
    custom_id: str | None
    body: dict[str, Any] | None = None
    failure: ResultLine | None = None


def _request_id() -> str:
    return f"batch_req_{secrets.token_hex(12)}"


def success(number: int, custom_id: str, body: dict[str, Any]) -> ResultLine:
    line = {"id": _request_id(), "custom_id": custom_id,
            "response": {"status_code": 200, "request_id": f"req_{uuid.uuid4().hex}", "body": body}, "error": None}
    return ResultLine(number, True, orjson.dumps(line, option=orjson.OPT_SERIALIZE_NUMPY).decode())


def api_failure(number: int, custom_id: str, error: APIError) -> ResultLine:
    """A request the server refused, written as OpenAI writes it: the status and the error body."""
    status, openai_type = status_of(error.reason, OPENAI), REASONS[error.reason][1]
    metrics.FAILURES.labels(BATCH_ROUTE, error.reason).inc()
    body = {"error": {"message": error.message, "type": openai_type, "param": error.param, "code": error.reason}}
    line = {"id": _request_id(), "custom_id": custom_id,
            "response": {"status_code": status, "request_id": f"req_{uuid.uuid4().hex}", "body": body}, "error": None}
    return ResultLine(number, False, orjson.dumps(line).decode())


def line_failure(number: int, custom_id: str | None, code: str, message: str) -> ResultLine:
    """A line that is not a request at all (bad JSON, missing fields, wrong url)."""
    metrics.FAILURES.labels(BATCH_ROUTE, code).inc()
    line = {"id": _request_id(), "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": f"line {number + 1}: {message}"}}
    return ResultLine(number, False, orjson.dumps(line).decode())


def parse_line(number: int, raw: bytes, endpoint: str, seen: set[str]) -> Line:
    """A request line {custom_id, method, url, body}, or the failure that says why it is not one."""
    try:
        item = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return Line(number, None, failure=line_failure(number, None, "invalid_json", f"not valid JSON: {exc}"))
    custom_id = item.get("custom_id") if isinstance(item, dict) else None
    if not isinstance(custom_id, str) or not custom_id:
        return Line(number, None, failure=line_failure(number, None, "missing_custom_id",
                                                       "a line needs a non-empty string custom_id"))
    problem = None
    if custom_id in seen:
        problem = ("duplicate_custom_id", f"custom_id {custom_id!r} appeared on an earlier line")
    elif item.get("method", "POST") != "POST":
        problem = ("invalid_method", "method must be POST")
    elif item.get("url") != endpoint:
        problem = ("mismatched_url", f"url {item.get('url')!r} differs from the batch's endpoint {endpoint!r}")
    elif not isinstance(item.get("body"), dict):
        problem = ("invalid_body", "body must be a JSON object")
    if problem:
        return Line(number, custom_id, failure=line_failure(number, custom_id, *problem))
    seen.add(custom_id)
    return Line(number, custom_id, body=item["body"])


class PartRunner:
    """Executes the lines of one part against a Service, within the runner's token reservations."""

    def __init__(self, service: Service, reserve: Reserve, release: Release, run_tokens: int, pace: Pace) -> None:
        self.service = service
        self.reserve = reserve
        self.release = release
        self.pace = pace
        self.run_tokens = run_tokens
        self.last_attempt = False  # set: serving-path failures fail their lines instead of raising Transient

    async def run(self, endpoint: str, lines: list[Line]) -> list[ResultLine]:
        results = {line.number: line.failure for line in lines if line.failure is not None}
        requests = [line for line in lines if line.failure is None]
        if endpoint == EMBEDDINGS:
            results.update(await self._embeddings(requests))
        else:
            done = await asyncio.gather(*(self._score(endpoint, line) for line in requests))
            results.update({r.line: r for r in done})
        return [results[line.number] for line in lines]

    async def _embeddings(self, lines: list[Line]) -> dict[int, ResultLine]:
        service, results = self.service, {}
        accepted: list[tuple[Line, EmbeddingRequest, RaggedIds]] = []
        for line in lines:
            assert line.custom_id is not None
            await self.pace()
            try:
                req: EmbeddingRequest = parse(EmbeddingRequest, line.body, OPENAI)
                service.check_model(req.model)
                service.require_kind("embedding", EMBEDDINGS)
                service.check_dimensions(req.dimensions)
                service.check_encoding_format(req.encoding_format)
                seqs = await service.tokenize(req.input, req.truncate, req.truncation_direction, req.prompt_name,
                                              "input", Timings(time.monotonic()), req.instruction)
            except APIError as error:
                results[line.number] = api_failure(line.number, line.custom_id, error)
                continue
            accepted.append((line, req, seqs))
        groups: list[list[tuple[Line, EmbeddingRequest, RaggedIds]]] = []
        group: list[tuple[Line, EmbeddingRequest, RaggedIds]] = []
        tokens = 0
        for item in accepted:
            if group and tokens + item[2].num_tokens > self.run_tokens:
                groups.append(group)
                group, tokens = [], 0
            group.append(item)
            tokens += item[2].num_tokens
        if group:
            groups.append(group)
        for done in await asyncio.gather(*(self._embed_group(g) for g in groups)):
            results.update(done)
        return results

    async def _embed_group(self, group: list[tuple[Line, EmbeddingRequest, RaggedIds]]) -> dict[int, ResultLine]:
        seqs = RaggedIds.concat([s for _, _, s in group])
        normalize = self.service.info.normalize
        await self.reserve(seqs.num_tokens)
        try:
            rows = await self.service.pipeline.run(seqs, TASK_EMBED, normalize, Timings(time.monotonic()))
        except APIError as error:
            if error.reason in TRANSIENT_REASONS and not self.last_attempt:
                raise Transient(error.message) from error
            return {line.number: api_failure(line.number, line.custom_id, error)  # type: ignore[arg-type]
                    for line, _, _ in group}
        finally:
            self.release(seqs.num_tokens)
        results, start = {}, 0
        for line, req, line_seqs in group:
            await self.pace()
            own = matryoshka(rows[start:start + line_seqs.num_seqs], req.dimensions, normalize)
            start += line_seqs.num_seqs
            data = [{"object": "embedding", "index": i, "embedding": value}
                    for i, value in enumerate(encode_rows(own, req.encoding_format))]
            usage = {"prompt_tokens": line_seqs.num_tokens, "total_tokens": line_seqs.num_tokens}
            body = {"object": "list", "data": data, "model": self.service.model_name, "usage": usage}
            results[line.number] = success(line.number, line.custom_id, body)  # type: ignore[arg-type]
        return results

    async def _score(self, endpoint: str, line: Line) -> ResultLine:
        assert line.custom_id is not None
        service = self.service
        await self.pace()
        try:
            if endpoint == "/v1/rerank":
                rerank: CohereRerankRequest = parse(CohereRerankRequest, line.body, OPENAI)
                service.check_model(rerank.model)
                texts = [doc if isinstance(doc, str) else doc.text for doc in rerank.documents]
                queries: str | list[str] = rerank.query
                options: dict[str, Any] = dict(truncate=rerank.truncate, direction="right", raw_scores=False,
                                               instruction=rerank.instruction, param="documents")
            else:
                pairs: ScoreRequest = parse(ScoreRequest, line.body, OPENAI)
                service.check_model(pairs.model)
                if isinstance(pairs.text_1, list) and not pairs.text_1:
                    raise APIError("empty_input", "'text_1' must not be empty", param="text_1")
                queries, texts = score_pairs(pairs.text_1, pairs.text_2)
                options = dict(truncate=pairs.truncate, direction="right", raw_scores=pairs.raw_scores,
                               instruction=pairs.instruction, param="text_2")
            estimate = sum(len(t) for t in texts) // 3 + 1  # tokens are not known before tokenizing; ~3 chars each
            await self.reserve(estimate)
            try:
                result = await service.score(queries, texts, route=endpoint, **options)
            finally:
                self.release(estimate)
        except APIError as error:
            if error.reason in TRANSIENT_REASONS and not self.last_attempt:
                raise Transient(error.message) from error
            return api_failure(line.number, line.custom_id, error)
        if endpoint == "/v1/rerank":
            order = ranking(result.values)[: rerank.top_n or None]
            items = [{"index": i, "relevance_score": float(result.values[i]),
                      **({"document": {"text": texts[i]}} if rerank.return_documents else {})} for i in order]
            body: dict[str, Any] = {"id": str(uuid.uuid4()), "model": service.model_name, "results": items,
                                    "usage": {"total_tokens": result.num_tokens}}
        else:
            body = {"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                    "model": service.model_name,
                    "data": [{"index": i, "object": "score", "score": float(v)} for i, v in enumerate(result.values)],
                    "usage": {"prompt_tokens": result.num_tokens, "total_tokens": result.num_tokens,
                              "completion_tokens": 0}}
        return success(line.number, line.custom_id, body)
