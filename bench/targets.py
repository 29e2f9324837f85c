"""What a benchmark measures: a server over HTTP, or a model in this process.

A target turns one request's inputs into a Call: an argument-less coroutine function that does the
request and nothing else. Request bodies are serialised when the Call is made, before any timing
starts, so a measured call is the HTTP round trip (or the in-process forward pass and copy back).
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

import numpy as np

from quiver.bench.api import ServerApi
from quiver.bench.http_client import HttpSession
from quiver.bench.inprocess import Unsupported

Call = Callable[[], Awaitable[Any]]


class RequestFailed(RuntimeError):
    """A server answered a benchmark request with an error status."""


class HttpTarget:
    """A server measured over HTTP; any number of clients may share it."""

    in_process = False

    def __init__(self, name: str, url: str, session: HttpSession, api: ServerApi) -> None:
        self.name = name
        self.url = url
        self.session = session
        self.api = api

    async def post(self, path: str, body: bytes) -> bytes:
        """The body of a 200 answer to POST path; RequestFailed for any other status."""
        status, content = await self.session.request("POST", path, body)
        if status != 200:
            raise RequestFailed(f"{self.name}: POST {path} answered {status}: {content[:400].decode(errors='replace')}")
        return content

    def _call(self, path: str, body: bytes) -> Call:
        return lambda: self.post(path, body)

    def embed_ids_call(self, rows: np.ndarray) -> Call:
        return self._call(*self.api.embed_request(rows.tolist()))

    def embed_texts_call(self, texts: list[str]) -> Call:
        return self._call(*self.api.embed_request(texts))

    def score_call(self, query: str, documents: list[str]) -> Call:
        return self._call(*self.api.rerank_request(query, documents))

    async def embed(self, inputs: np.ndarray | list[str]) -> np.ndarray:
        """Embeddings of token-id rows or texts, for the correctness gate."""
        payload = inputs.tolist() if isinstance(inputs, np.ndarray) else inputs
        return self.api.embeddings_of(await self.post(*self.api.embed_request(payload)))

    async def score(self, query: str, documents: list[str]) -> np.ndarray:
        return self.api.scores_of(await self.post(*self.api.rerank_request(query, documents)), len(documents))


class InProcessTarget:
    """A model in this process: one caller at a time, so only one client is ever measured."""

    in_process = True

    def __init__(self, name: str, runner: Any) -> None:
        self.name = name
        self.runner = runner

    def _method(self, name: str) -> Callable[..., Any]:
        method = getattr(self.runner, name, None)
        if method is None:
            raise Unsupported(f"{self.name} takes no {name.replace('_', ' ')} requests")
        return method

    @staticmethod
    def _call(method: Callable[..., Any], *args: Any) -> Call:
        async def call() -> Any:
            return method(*args)

        return call

    def embed_ids_call(self, rows: np.ndarray) -> Call:
        return self._call(self._method("embed_ids"), rows)

    def embed_texts_call(self, texts: list[str]) -> Call:
        return self._call(self._method("embed_texts"), texts)

    def score_call(self, query: str, documents: list[str]) -> Call:
        return self._call(self._method("score"), query, documents)

    def close(self) -> None:
        self.runner.close()


Target = HttpTarget | InProcessTarget
