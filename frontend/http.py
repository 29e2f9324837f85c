"""The HTTP plumbing every route shares: bounded body reading, JSON, auth, errors and metrics.

`endpoint(...)` wraps a handler so that it reads nothing unbounded, answers every failure in its
API's own error format, never lets an exception escape as a crash, and records one request metric.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import time
from typing import Any, Awaitable, Callable

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from quiver.frontend import metrics
from quiver.frontend.errors import APIError, render

log = logging.getLogger("quiver.frontend")

Handler = Callable[[Request], Awaitable[Response]]

CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left first; never reaches the client


class ClientDisconnected(Exception):
    """The HTTP client went away before its answer was ready."""


async def _wait_for_disconnect(request: Request) -> None:
    """Return once the client has gone: after the body is read, the next ASGI message is the disconnect."""
    await request.state.body_read.wait()
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(handler: Handler, request: Request) -> Response:
    """Run the handler, but cancel it (and with it the request's unstarted chunks) if the client leaves."""
    request.state.body_read = asyncio.Event()
    work = asyncio.ensure_future(handler(request))
    watch = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait((work, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not work.done():
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        raise ClientDisconnected
    return work.result()


def json_response(body: Any, headers: dict[str, str] | None = None, status: int = 200) -> Response:
    return Response(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status,
                    media_type="application/json", headers=headers)


async def read_json(request: Request, limit: int) -> Any:
    """The request body parsed as JSON, read no further than `limit` bytes (413 beyond)."""
    try:
        return _parse_json(await _read_body(request, limit))
    finally:
        body_read = getattr(request.state, "body_read", None)
        if body_read is not None:
            body_read.set()


async def _read_body(request: Request, limit: int) -> bytearray:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError("body_too_large", f"the request body of {declared} bytes is over the {limit}-byte limit")
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:
            raise APIError("body_too_large", f"the request body is over the {limit}-byte limit")
    return body


def _parse_json(body: bytearray) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise APIError("bad_json", f"the request body is not valid JSON: {exc}") from exc


def parse(model: type[BaseModel], body: Any, openai_style: bool) -> Any:
    """Validate a body against a request model; the first problem becomes the error message."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        message = f"{where}: {first['msg']}"
        if len(exc.errors()) > 1:
            message += f" (and {len(exc.errors()) - 1} more problems)"
        # OpenAI answers a malformed request with 400; Text Embeddings Inference with 422.
        raise APIError("invalid_request" if openai_style else "validation", message, param=where) from exc


def authorized(request: Request, api_key: str) -> bool:
    if not api_key:
        return True
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


def endpoint(route: str, openai_style: bool, api_key: str, public: bool = False) -> Callable[[Handler], Handler]:
    def wrap(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def wrapped(request: Request) -> Response:
            started = time.monotonic()
            try:
                if not public and not authorized(request, api_key):
                    raise APIError("unauthorized", "a valid API key is required: 'Authorization: Bearer <key>'",
                                   headers={"WWW-Authenticate": "Bearer"})
                response = await _unless_disconnected(handler, request)
            except ClientDisconnected:
                metrics.FAILURES.labels(route, "client_disconnected").inc()
                response = Response(status_code=CLIENT_CLOSED_REQUEST)
            except APIError as error:
                metrics.FAILURES.labels(route, error.reason).inc()
                response = render(error, openai_style)
            except Exception:
                log.exception("unexpected failure on %s", route)
                metrics.FAILURES.labels(route, "internal").inc()
                response = render(APIError("internal", "internal server error"), openai_style)
            metrics.REQUESTS.labels(route, str(response.status_code)).inc()
            if response.status_code < 400:
                metrics.STAGE_SECONDS.labels(route, "total").observe(time.monotonic() - started)
            return response

        return wrapped

    return wrap
