"""The Starlette application: the route table wired to the model registry (one Service per model), the
broker link started in the lifespan.

Nothing here imports torch: the frontend needs the tokenizer and the checkpoint's JSON files only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from importlib.metadata import entry_points
from typing import AsyncIterator, Protocol

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from quiver.common.config import FrontendSettings
from quiver.common.security import client_from
from quiver.common.tracing import Tracing
from quiver.frontend.errors import OPENAI, TEI, APIError, render
from quiver.frontend.http import RouteApp, RouteSpec, endpoint
from quiver.frontend.keep_awake import CountedPool
from quiver.frontend.openapi import build_openapi
from quiver.frontend.models import build_registry
from quiver.frontend.routes import ROUTES
from quiver.frontend.service import Service
from quiver.frontend.tracing import RequestTracer
from quiver.frontend.warmup import PathWarmup

log = logging.getLogger("quiver.frontend")

# Installed packages that add routes to the frontend (the Batch API of quiver.jobs): each entry point
# names a factory (service, settings) -> an object with `routes` (RouteSpecs), `start()` and `stop()`.
EXTENSIONS_GROUP = "quiver.frontend_extensions"


class Extension(Protocol):
    routes: list[RouteSpec]

    def start(self) -> None: ...

    async def stop(self) -> None: ...


def load_extensions(service: Service, settings: FrontendSettings) -> list[Extension]:
    """The frontend extensions installed beside Quiver, built for this service."""
    return [entry.load()(service, settings) for entry in entry_points(group=EXTENSIONS_GROUP)]


class FrontendApp(Starlette):
    """Starlette, with a request for one of `exact`'s (method, path) pairs handed straight to its route's
    app: its prologue answers every error itself, so Starlette's two middlewares (a Request and three
    closures per request) and the router's scan would only pass it through. Anything else (other methods,
    paths with parameters, unknown paths, a root path, the lifespan) goes through Starlette as before."""

    exact: dict[tuple[str, str], ASGIApp] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            route = self.exact.get((scope["method"], scope["path"]))
            if route is not None:
                scope["app"] = self
                await route(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def exact_routes(routes: list[Route]) -> dict[tuple[str, str], ASGIApp]:
    """(method, path) -> app for each route that Starlette's router would pick for exactly that path and
    method: a path without parameters, matched by no route before it (the router takes the first match)."""
    exact: dict[tuple[str, str], ASGIApp] = {}
    for index, route in enumerate(routes):
        if route.param_convertors or any(earlier.path_regex.match(route.path) for earlier in routes[:index]):
            continue
        for method in route.methods or ():
            exact.setdefault((method, route.path), route.app)
    return exact


def request_tracer(settings: FrontendSettings) -> RequestTracer | None:
    """The frontend's tracer when --otlp-endpoint is set (server.py checked at start-up that it can be used)."""
    if not settings.otlp_endpoint:
        return None
    return RequestTracer(Tracing(settings.otlp_endpoint, settings.otlp_service_name or "quiver-frontend", "frontend"))


def create_app(settings: FrontendSettings) -> FrontendApp:
    registry, client = build_registry(settings, client_from(settings.curve_secret_key, settings.curve_broker_key))
    service = registry.default
    extensions = load_extensions(service, settings)
    specs = ROUTES + tuple(spec for extension in extensions for spec in extension.routes)
    tracer = request_tracer(settings)
    warmup = PathWarmup(registry.services, client, settings.warmup_rounds, settings.api_key)
    routes = [Route(spec.path, RouteApp(endpoint(spec, registry, settings, tracer)), methods=[spec.method])
              for spec in specs]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        asyncio.get_running_loop().set_default_executor(CountedPool(thread_name_prefix="asyncio"))  # keep_awake.py
        await client.start()
        for extension in extensions:
            extension.start()
        if not await client.wait_for_broker(settings.liveness_window_s):
            log.warning("the broker at %s has not answered yet; answering 503 until it does", settings.broker)
        for each in registry.services:
            log.info("frontend serving %s (%s) through broker %s", each.model_name, each.info.kind, settings.broker)
        warmup.start(app)
        yield
        await warmup.stop()
        for extension in extensions:
            await extension.stop()
        await client.close()
        for each in registry.services:
            each.tokenizer.close()
        if tracer is not None:
            tracer.shutdown()

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        reason = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
        return render(APIError(reason, f"{request.method} {request.url.path}: {exc.detail}"),
                      OPENAI if request.url.path.startswith("/v1/") else TEI)

    app = FrontendApp(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.exact = exact_routes(routes)
    app.state.service = service
    app.state.models = registry
    app.state.warmup = warmup
    app.state.openapi = build_openapi(specs, keyed=bool(settings.api_key))
    return app
