"""The request path warmed before /health says ready.

A fresh server's first request is the first to run each line of the path: CPython has not specialised
that code yet, and the routes, the tokenizer and the worker's intake meet their first input. On an H100 a
fresh server's first 512-token text took 14.3-16.2 ms at the client against about 6 ms for the next ones
(bench/RESULTS.md, 2026-12-07, evening); with this warm-up, 10.2 ms: the rest is the connection's set-up
and the tokenizer's first sight of the text's words. So each frontend process, once a worker is live,
sends a few requests of each served model's kind through its own app: the real routes, tokenizer, broker
and workers, nothing faked. /health answers 503 until they are answered, or
until WARMUP_DEADLINE_S has passed (a worker that never answers must not keep the server unready). Their
requests are counted in the metrics like any others, under the model's name, and in
quiver_frontend_warmup_requests_total.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.types import ASGIApp, Message

from quiver.common.model_info import KIND_CLASSIFIER, KIND_EMBEDDING, KIND_RERANKER, KIND_SPARSE
from quiver.frontend import metrics
from quiver.frontend.broker_client import BrokerClient
from quiver.frontend.service import Service

log = logging.getLogger("quiver.frontend")

WARMUP_DEADLINE_S = 30.0
WORKER_POLL_S = 0.05
# Words per warm-up text: a short query, a passage, a long document (each at most half the model's limit).
TEXT_WORDS = (8, 120, 480)
WORD = "warm"


class WarmupRefused(Exception):
    """A warm-up request was answered with an error: the warm-up ends there."""


@dataclass(frozen=True)
class WarmupRequest:
    path: str
    body: dict[str, Any]


def text_of(words: int, max_input_length: int) -> str:
    """A text of `words` words, fewer where the model's limit is shorter (a word may be two tokens)."""
    return " ".join([WORD] * max(1, min(words, (max_input_length - 8) // 2)))


def requests_for(service: Service) -> list[WarmupRequest]:
    """One round of warm-up requests for a model: the routes its kind answers, at each length."""
    info, name = service.info, service.model_name
    texts = [text_of(words, info.max_input_length) for words in TEXT_WORDS]
    if info.kind == KIND_EMBEDDING:
        ids = [[1 + i % (info.vocab_size - 1) for i in range(len(text.split()))] for text in texts]
        return ([WarmupRequest("/v1/embeddings", {"model": name, "input": text}) for text in texts]
                + [WarmupRequest("/v1/embeddings", {"model": name, "input": [row]}) for row in ids]
                + [WarmupRequest("/embed", {"model": name, "inputs": text}) for text in texts])
    if info.kind == KIND_SPARSE:
        return [WarmupRequest("/embed_sparse", {"model": name, "inputs": text}) for text in texts]
    if info.kind == KIND_RERANKER:
        return [WarmupRequest("/rerank", {"model": name, "query": texts[0], "texts": [text, text]}) for text in texts]
    if info.kind == KIND_CLASSIFIER:
        return [WarmupRequest("/predict", {"model": name, "inputs": text}) for text in texts]
    return []


async def call_app(app: ASGIApp, request: WarmupRequest, headers: list[tuple[bytes, bytes]]) -> tuple[int, bytes]:
    """POST one request to the app in this process, as uvicorn would hand it over; (status, body)."""
    body = orjson.dumps(request.body)
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": request.path, "raw_path": request.path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()), *headers],
        "client": ("127.0.0.1", 0), "server": ("127.0.0.1", 0),
    }
    sent = False
    never_disconnects = asyncio.Event()

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never_disconnects.wait()
        return {"type": "http.disconnect"}

    status, parts = 0, []

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(parts)


class PathWarmup:
    """Runs the warm-up once the first worker is live; `done` says whether /health may answer 200."""

    def __init__(self, services: list[Service], client: BrokerClient, rounds: int, api_key: str) -> None:
        self.services = services
        self.client = client
        self.rounds = rounds
        self.headers = [(b"authorization", f"Bearer {api_key}".encode())] if api_key else []
        self.done = rounds <= 0
        self._task: asyncio.Task | None = None

    def start(self, app: ASGIApp) -> None:
        if not self.done:
            self._task = asyncio.create_task(self._run(app))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self, app: ASGIApp) -> None:
        while self.client.live_workers == 0:
            await asyncio.sleep(WORKER_POLL_S)
        started = time.monotonic()
        try:
            sent = await asyncio.wait_for(self._send_rounds(app), WARMUP_DEADLINE_S)
            log.info("request path warmed: %d requests in %.2f s", sent, time.monotonic() - started)
        except WarmupRefused as exc:
            log.warning("%s; serving without the rest of the warm-up", exc)
        except asyncio.TimeoutError:
            log.warning("the request path's warm-up did not finish within %.0f s; serving without it", WARMUP_DEADLINE_S)
        except Exception:
            log.exception("the request path's warm-up failed; serving without it")
        finally:
            self.done = True

    async def _send_rounds(self, app: ASGIApp) -> int:
        """Each round for every model with a live worker (the others are not waited for), `rounds` times;
        the first refused request ends the warm-up (WarmupRefused)."""
        sent = 0
        live = [s for s in self.services if not s.fingerprint or self.client.workers_by_model.get(s.fingerprint, 0)]
        for _ in range(self.rounds):
            for service in live:
                for request in requests_for(service):
                    status, body = await call_app(app, request, self.headers)
                    sent += 1
                    metrics.WARMUP_REQUESTS.inc()
                    if status != 200:
                        raise WarmupRefused(f"warm-up request to {request.path} answered {status}: "
                                            f"{body[:300].decode(errors='replace')}")
        return sent
