"""The Starlette application: routes wired to one Service, the broker link started in the lifespan.

Nothing here imports torch: the frontend needs the tokenizer and the checkpoint's JSON files only.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import AsyncIterator

from prometheus_client import REGISTRY, CollectorRegistry
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from quiver.common.config import FrontendSettings
from quiver.common.model_info import default_model_dir, load_model_info
from quiver.common.security import client_from
from quiver.frontend.broker_client import BrokerClient
from quiver.frontend.errors import APIError, render
from quiver.frontend.http import endpoint, json_response
from quiver.frontend.openapi import build_openapi
from quiver.frontend import routes_embed, routes_meta, routes_score
from quiver.frontend.service import Service
from quiver.jobs.routes import BatchAPI

log = logging.getLogger("quiver.frontend")


def metrics_registry() -> CollectorRegistry:
    """The default registry, or one that merges every uvicorn process's files in multiprocess mode."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return REGISTRY
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return registry


def create_app(settings: FrontendSettings) -> Starlette:
    info = load_model_info(settings.model or default_model_dir(), name=settings.served_model_name or None)
    client = BrokerClient(settings.broker, settings.heartbeat_interval_s, settings.liveness,
                          curve=client_from(settings.curve_secret_key, settings.curve_broker_key))
    service = Service(settings, info, client)
    key = settings.api_key

    routes = []
    for factory, openai_style, public in (
        (routes_embed.openai_embeddings, True, False),
        (routes_embed.tei_embed, False, False),
        (routes_score.tei_rerank, False, False),
        (routes_score.cohere_rerank, True, False),
        (routes_score.vllm_score, True, False),
        (routes_score.tei_predict, False, False),
        (routes_meta.tokenize, False, False),
        (routes_meta.info, False, False),
        (routes_meta.health, False, True),
    ):
        path, handler = factory(service)
        method = "GET" if path in ("/info", "/health") else "POST"
        routes.append(Route(path, endpoint(path, openai_style, key, public)(handler), methods=[method]))
    path, handler = routes_meta.prometheus_metrics(metrics_registry)
    routes.append(Route(path, endpoint(path, False, key, public=True)(handler), methods=["GET"]))
    openapi_document = build_openapi()

    async def openapi(request: Request) -> Response:
        return json_response(openapi_document)

    routes.append(Route("/openapi.json", endpoint("/openapi.json", False, key, public=True)(openapi), methods=["GET"]))
    batch_api = BatchAPI(service, settings)
    routes += batch_api.routes

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await client.start()
        batch_api.start()
        if not await client.wait_for_broker(settings.liveness_window_s):
            log.warning("the broker at %s has not answered yet; answering 503 until it does", settings.broker)
        log.info("frontend serving %s (%s) through broker %s", service.model_name, info.kind, settings.broker)
        yield
        await batch_api.stop()
        await client.close()

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        reason = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "invalid_request")
        return render(APIError(reason, f"{request.method} {request.url.path}: {exc.detail}"),
                      openai_style=request.url.path.startswith("/v1/"))

    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error})
    app.state.service = service
    return app
