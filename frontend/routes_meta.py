"""Routes about the server rather than embeddings: /health, /info, /metrics, /tokenize."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response

from quiver.common.model_info import KIND_EMBEDDING
from quiver.common.version import __version__
from quiver.frontend.errors import APIError
from quiver.frontend.http import json_response, parse, read_json
from quiver.frontend.long_inputs import long_input_modes
from quiver.frontend.quantize import formats_for
from quiver.frontend.schemas import TokenizeRequest
from quiver.frontend.service import Service


def health(service: Service):
    async def handler(request: Request) -> Response:
        client = service.client
        if not client.broker_alive:
            raise APIError("unavailable", "the broker is unreachable")
        if client.live_workers == 0:
            raise APIError("unavailable", "no worker is live")
        return json_response({"status": "ok", "live_workers": client.live_workers})

    return "/health", handler


def info(service: Service):
    async def handler(request: Request) -> Response:
        model = service.info
        settings = service.settings
        return json_response({
            "model_id": service.model_name,
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
                "request_timeout_s": settings.request_timeout_s,
                "auto_truncate": settings.auto_truncate,
            },
            "version": __version__,
        })

    return "/info", handler


def prometheus_metrics(registry_factory):
    async def handler(request: Request) -> Response:
        return Response(generate_latest(registry_factory()), media_type=CONTENT_TYPE_LATEST)

    return "/metrics", handler


def tokenize(service: Service):
    async def handler(request: Request) -> Response:
        req: TokenizeRequest = parse(TokenizeRequest, await read_json(request, service.settings.max_body_bytes), False)
        texts = [req.inputs] if isinstance(req.inputs, str) else req.inputs
        service.check_count(len(texts), "inputs")
        service.check_texts(texts, "inputs")
        prefix = service.input_prefix(req.prompt_name, req.instruction)
        return json_response(service.tokenizer.tokens([prefix + t for t in texts], req.add_special_tokens))

    return "/tokenize", handler
