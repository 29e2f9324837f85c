"""The request prologue every route shares, built from the route's entry in the route table.

`endpoint(spec, ...)` turns a RouteSpec into a Starlette endpoint that, in this order: checks the
Host header (when bound to loopback, against DNS rebinding), the API key (unless the route is
public), the Content-Type (JSON only), reserves in-flight tokens estimated from the body's size
(429 before anything grows), reads the body within its size and time limits, parses and validates
it, runs the handler (cancelled if the client leaves), renders any failure in the route's error
style and records one request metric. Handlers see a validated body and never an unbounded read.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from quiver.common.config import FrontendSettings
from quiver.frontend import metrics
from quiver.frontend.admission import CURRENT_TICKET, Ticket, estimated_tokens
from quiver.frontend.errors import OPENAI, APIError, render
from quiver.frontend.models import ModelRegistry
from quiver.frontend.pipeline import CURRENT_PRIORITY, PRIORITY_HEADER, requested_priority
from quiver.frontend.service import Service
from quiver.frontend.tasks import await_within, uncancel
from quiver.frontend.tracing import UNTRACED_PATHS, RequestTracer

log = logging.getLogger("quiver.frontend")

CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left first; never reaches the client
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "[::1]"})
# Bodies larger than this are parsed and validated on the tokenization pool, off the event loop
# (orjson and pydantic take tens of milliseconds over a few megabytes).
PARSE_ON_POOL_BYTES = 256 * 1024
JSON_MEDIA_TYPE = "application/json"
# A client that leaves is noticed at most this long after its request began (see _unless_disconnected).
DISCONNECT_WATCH_AFTER_S = 0.02
PRIORITY_HEADER_NAME = PRIORITY_HEADER.encode()


@dataclass
class Call:
    """One request as a handler sees it: the service, the raw request, and its validated body."""

    service: Service
    request: Request
    body: Any  # an instance of the route's request model; None for a route without a body
    spec: RouteSpec


Handler = Callable[[Call], Awaitable[Response]]


@dataclass(frozen=True)
class RouteSpec:
    """One route, declared once: the app, /openapi.json and the prologue are built from it."""

    path: str
    method: str  # GET or POST
    summary: str
    handler: Handler
    request: type[BaseModel] | None  # the body's model; None: the route takes no body
    response: Any  # a pydantic model or a JSON schema of the 200 answer
    style: str  # errors.OPENAI or errors.TEI
    public: bool = False  # answered without the API key
    statuses: tuple[int, ...] = ()  # error statuses the handler itself can give
    media_type: str = JSON_MEDIA_TYPE
    request_schema: dict[str, Any] | None = None  # the body's schema where no one model describes it


class ClientDisconnected(Exception):
    """The HTTP client went away before its answer was ready."""


def encode_json(body: Any) -> bytes:
    """JSON bytes of a response body; numpy arrays are written by orjson's own serializer, with no
    Python step per number (float32 rows in their shortest round-trip form)."""
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)


def json_response(body: Any, headers: dict[str, str] | None = None, status: int = 200) -> Response:
    return Response(encode_json(body), status_code=status, media_type=JSON_MEDIA_TYPE, headers=headers)


async def _wait_for_disconnect(request: Request) -> None:
    """Return once the client has gone: after the body is read, the next ASGI message is the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(handler: Handler, call: Call, watch: bool) -> Response:
    """Run the handler in this task; if the client leaves first, a watcher cancels it (and with it the
    request's unanswered chunks) and the request ends as ClientDisconnected. The handler runs in the
    request's own task rather than a task of its own: one turn of the event loop less per request. The
    watcher starts only once the handler has run for DISCONNECT_WATCH_AFTER_S, so a short request pays a
    timer instead of a task (its start, its cancel, and their turns of the event loop)."""
    if not watch:
        return await handler(call)
    request_task = asyncio.current_task()
    assert request_task is not None
    loop = asyncio.get_running_loop()
    client_left = False
    watcher: asyncio.Task | None = None

    async def cancel_on_disconnect() -> None:
        nonlocal client_left
        await _wait_for_disconnect(call.request)
        client_left = True
        request_task.cancel()

    def start_watching() -> None:
        nonlocal watcher
        watcher = loop.create_task(cancel_on_disconnect())

    timer = loop.call_later(DISCONNECT_WATCH_AFTER_S, start_watching)
    try:
        return await handler(call)
    except asyncio.CancelledError:
        if not client_left:
            raise
        uncancel(request_task)
        raise ClientDisconnected from None
    finally:
        timer.cancel()
        if watcher is not None:
            watcher.cancel()


async def _read_body(request: Request, limit: int) -> bytearray:
    body = bytearray()
    try:
        async for part in request.stream():
            body += part
            if len(body) > limit:
                raise APIError("body_too_large", f"the request body is over the {limit}-byte limit")
    except ClientDisconnect as exc:
        raise ClientDisconnected from exc
    return body


def header_values(request: Request) -> dict[bytes, bytes]:
    """The request's headers by (lower-case) name, the first of each as Starlette's `headers.get` gives it,
    read in one pass: each `headers.get` scans them all again and raises KeyError for a missing one."""
    return dict(reversed(request.scope["headers"]))


def header(headers: dict[bytes, bytes], name: bytes) -> str | None:
    """One header's value from header_values' dict, decoded as Starlette decodes it (latin-1); None if absent."""
    value = headers.get(name)
    return None if value is None else value.decode("latin-1")


def declared_length(value: str | None) -> int | None:
    """The Content-Length header's value as a number, if it is one."""
    return int(value) if value is not None and value.isdigit() else None


def parse_json(body: bytes | bytearray) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise APIError("bad_json", f"the request body is not valid JSON: {exc}") from exc


def parse(model: type[BaseModel], body: Any, style: str) -> Any:
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
        raise APIError("invalid_request" if style == OPENAI else "validation", message, param=where) from exc


def parse_body(spec: RouteSpec, raw: bytes | bytearray) -> Any:
    """The body as JSON, validated against the route's request model when it has one."""
    body = parse_json(raw)
    return parse(spec.request, body, spec.style) if spec.request is not None else body


async def _on_pool_if_large(service: Service, size: int, work: Callable[[], Any]) -> Any:
    if size > PARSE_ON_POOL_BYTES:
        return await asyncio.get_running_loop().run_in_executor(service.tokenizer.pool, work)
    return work()


def authorized(authorization: str | None, api_key: str) -> bool:
    """Whether the Authorization header's value carries the API key (always, without a key)."""
    if not api_key:
        return True
    scheme, _, token = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name of a Host header without its port: 'localhost:8080' -> 'localhost', '[::1]:80' -> '[::1]'."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[: header.find("]") + 1]
    return header.partition(":")[0]


def check_host(host: str | None) -> None:
    """A server bound to loopback answers only requests addressed to a loopback name (DNS rebinding)."""
    if host is not None and host_name(host) not in LOOPBACK_HOSTS:
        raise APIError("misdirected", f"this server listens on loopback and answers only requests for "
                                      f"localhost, 127.0.0.1 or [::1], not for the Host {host[:100]!r}")


def check_content_type(content_type: str | None) -> None:
    """Bodies are JSON: application/json (any parameters) or no Content-Type at all; else 415.

    Refusing other types keeps cross-site form posts (text/plain, form encodings), which browsers
    send without a preflight, from reaching a keyless server.
    """
    value = (content_type or "").strip()
    if not value:
        return
    media = value.partition(";")[0].strip().lower()
    if media != JSON_MEDIA_TYPE and not (media.startswith("application/") and media.endswith("+json")):
        raise APIError("unsupported_media_type",
                       f"the request body must be JSON sent as Content-Type: application/json, not {value[:100]!r}")


def requested_model(body: Any, request: Request) -> str | None:
    """The model a request names: its body's `model` field, else a `model` query parameter."""
    model = body.get("model") if isinstance(body, dict) else getattr(body, "model", None)
    if model is None and request.scope["query_string"]:  # parsing an empty query string costs tens of µs
        model = request.query_params.get("model")
    return model if isinstance(model, str) else None


class RouteApp:
    """A route's endpoint (request -> response) as a plain ASGI app. Starlette would wrap such a function
    in its exception handlers, two more closures per request and one more hop per message sent, which the
    prologue makes idle: it answers every error itself."""

    def __init__(self, serve: Callable[[Request], Awaitable[Response]]) -> None:
        self.serve = serve

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.serve(Request(scope, receive, send))
        await response(scope, receive, send)


def endpoint(spec: RouteSpec, models: ModelRegistry, settings: FrontendSettings,
             tracer: RequestTracer | None = None) -> Callable[[Request], Awaitable[Response]]:
    """The route's handler behind the prologue; the request's `model` picks the Service it is given."""
    route = spec.path
    service = models.default  # its admission budget and tokenization pool serve the prologue: shared by all
    guard_host = is_loopback(settings.host)
    request_tracer = tracer if route not in UNTRACED_PATHS else None

    async def serve(request: Request) -> Response:
        started = time.monotonic()
        ticket: Ticket | None = None
        model_name = ""
        trace = request_tracer.start(request, spec.method, route) if request_tracer else None
        failure = ""
        try:
            headers = header_values(request)
            if guard_host:
                check_host(header(headers, b"host"))
            if not spec.public and not authorized(header(headers, b"authorization"), settings.api_key):
                raise APIError("unauthorized", "a valid API key is required: 'Authorization: Bearer <key>'",
                               headers={"WWW-Authenticate": "Bearer"})
            body = None
            if spec.request is not None or spec.request_schema is not None:
                CURRENT_PRIORITY.set(requested_priority(header(headers, PRIORITY_HEADER_NAME)))
                check_content_type(header(headers, b"content-type"))
                limit = settings.max_body_bytes
                declared = declared_length(header(headers, b"content-length"))
                if declared is not None and declared > limit:
                    raise APIError("body_too_large", f"the request body of {declared} bytes is over the {limit}-byte limit")
                if declared is not None:
                    ticket = service.admission.reserve(estimated_tokens(declared), estimated=True)
                try:
                    raw = await await_within(_read_body(request, limit), settings.body_timeout_s)
                except TimeoutError:
                    raise APIError("request_timeout",
                                   f"the request body did not arrive within {settings.body_timeout_s:g} s") from None
                if ticket is None:
                    ticket = service.admission.reserve(estimated_tokens(len(raw)), estimated=True)
                body = await _on_pool_if_large(service, len(raw), lambda: parse_body(spec, raw))
            CURRENT_TICKET.set(ticket)
            picked = models.pick(requested_model(body, request))
            model_name = picked.model_name
            response = await _unless_disconnected(spec.handler, Call(picked, request, body, spec),
                                                  watch=ticket is not None)
        except ClientDisconnected:
            failure = "client_disconnected"
            metrics.FAILURES_BY[route, "client_disconnected"].inc()
            response = Response(status_code=CLIENT_CLOSED_REQUEST)
        except APIError as error:
            failure = error.reason
            metrics.FAILURES_BY[route, error.reason].inc()
            response = render(error, spec.style)
        except Exception:
            log.exception("unexpected failure on %s", route)
            failure = "internal"
            metrics.FAILURES_BY[route, "internal"].inc()
            response = render(APIError("internal", "internal server error"), spec.style)
        finally:
            if ticket is not None:
                ticket.release()
        metrics.REQUESTS_BY[route, str(response.status_code), model_name].inc()
        if trace is not None:
            trace.finish(response.status_code, failure, model_name)
        if response.status_code < 400:
            metrics.STAGE_SECONDS_BY[route, "total", model_name].observe(time.monotonic() - started)
        return response

    return serve
