"""Handlers about the server rather than embeddings: /health, /info, /metrics, /tokenize, /v1/models."""

from __future__ import annotations

import os
import time

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from starlette.responses import Response

from quiver.common.model_info import KIND_EMBEDDING
from quiver.common.version import __version__
from quiver.frontend.errors import APIError
from quiver.frontend.http import Call, json_response
from quiver.frontend.long_inputs import long_input_modes
from quiver.frontend.quantize import formats_for
from quiver.frontend.schemas import TokenizeRequest

STARTED = int(time.time())


def metrics_registry() -> CollectorRegistry:
    """The default registry, or one that merges every uvicorn process's files in multiprocess mode."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return REGISTRY
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return registry


async def health(call: Call) -> Response:
    """200 while some worker is live and this process has warmed its request path; with several models,
    the live workers of each by name."""
    client = call.service.client
    if not client.broker_alive:
        raise APIError("unavailable", "the broker is unreachable")
    if client.live_workers == 0 and not await client.recheck_workers():
        raise APIError("unavailable", "no worker is live")
    if not call.request.app.state.warmup.done:
        raise APIError("unavailable", "warming up: this process is sending its first requests through the server")
    body: dict[str, object] = {"status": "ok", "live_workers": client.live_workers}
    services = call.request.app.state.models.services
    if len(services) > 1:
        body["models"] = {s.model_name: client.workers_by_model.get(s.fingerprint, 0) for s in services}
    return json_response(body)


async def info(call: Call) -> Response:
    """The facts of the model `?model=NAME` names (the first model by default)."""
    service = call.service
    model = service.info
    settings = service.settings
    return json_response({
        "model_id": service.model_name,
        "served_model_names": service.model_names,
        "model_type": model.model_type,
        "model_kind": model.kind,
        "architecture": model.architecture,
        "dimensions": model.output_dim,
        "max_input_length": model.max_input_length,
        "pooling": model.pooling,
        "normalize": model.normalize,
        "prompts": model.prompts,
        "default_prompt_name": model.default_prompt_name,
        "instruction_template": model.instruction_template,
        "encoding_formats": list(formats_for(model.quantizer)) if model.kind == KIND_EMBEDDING else [],
        "long_inputs": long_input_modes(settings) if model.kind == KIND_EMBEDDING else [],
        "labels": {str(i): label for i, label in model.id2label.items()} or None,
        "limits": {
            "max_body_bytes": settings.max_body_bytes,
            "max_inputs": settings.max_inputs,
            "max_input_chars": settings.max_input_chars,
            "max_inflight_tokens": settings.max_inflight_tokens,
            "max_tokenize_tokens": settings.max_tokenize_tokens,
            "request_timeout_s": settings.request_timeout_s,
            "auto_truncate": settings.auto_truncate,
            "header_timeout_s": settings.header_timeout_s,
            "body_timeout_s": settings.body_timeout_s,
            "keep_alive_timeout_s": settings.keep_alive_timeout_s,
            "max_connections": settings.max_connections,
            "max_header_bytes": settings.max_header_bytes,
            # /v1/contextualizedembeddings: documents per request, chunks in all, tokens per document
            "contextual_max_documents": settings.max_inputs,
            "contextual_max_chunks": settings.max_inputs,
            "contextual_max_document_tokens": model.max_input_length,
        },
        "version": __version__,
        "models": call.request.app.state.models.names(),
    })


async def prometheus_metrics(call: Call) -> Response:
    return Response(generate_latest(metrics_registry()), media_type=CONTENT_TYPE_LATEST)


async def tokenize(call: Call) -> Response:
    req: TokenizeRequest = call.body
    service = call.service
    texts = [req.inputs] if isinstance(req.inputs, str) else req.inputs
    service.check_count(len(texts), "inputs")
    service.check_texts(texts, "inputs")
    prefix = service.input_prefix(req.prompt_name, req.instruction)
    body = await service.tokenizer.tokens_json([prefix + t for t in texts], req.add_special_tokens,
                                               service.settings.max_tokenize_tokens)
    return Response(body, media_type="application/json")


async def models(call: Call) -> Response:
    """OpenAI's model list: every served model under each of its names."""
    cards = [{"id": name, "object": "model", "created": STARTED, "owned_by": "quiver",
              "max_model_len": service.info.max_input_length}
             for service in call.request.app.state.models.services for name in service.model_names]
    return json_response({"object": "list", "data": cards})
