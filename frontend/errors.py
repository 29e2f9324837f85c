"""Errors a request can meet, and how each API writes them.

Handlers raise APIError; the app renders it in the error style of the route it came from:
OpenAI's `{"error": {"message", "type", "param", "code"}}` (OpenAI, Cohere, vLLM routes), or Text
Embeddings Inference's `{"error", "error_type"}` (TEI routes). Every error is counted by route and
reason. Where the peers answer one mistake with different statuses, STYLE_STATUS says which.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.responses import Response

OPENAI, TEI = "openai", "tei"

# reason -> (HTTP status, OpenAI error type, TEI error_type)
REASONS: dict[str, tuple[int, str, str]] = {
    "bad_json": (400, "invalid_request_error", "Validation"),
    "invalid_request": (400, "invalid_request_error", "Validation"),
    "empty_input": (400, "invalid_request_error", "Empty"),
    "wrong_model_kind": (400, "invalid_request_error", "Validation"),
    "unauthorized": (401, "authentication_error", "Unauthorized"),
    "not_found": (404, "invalid_request_error", "NotFound"),
    "method_not_allowed": (405, "invalid_request_error", "NotFound"),
    "request_timeout": (408, "invalid_request_error", "Validation"),
    "body_too_large": (413, "invalid_request_error", "Validation"),
    "too_many_inputs": (413, "invalid_request_error", "Validation"),
    "response_too_large": (413, "invalid_request_error", "Validation"),
    "unsupported_media_type": (415, "invalid_request_error", "Validation"),
    "misdirected": (421, "invalid_request_error", "Validation"),
    "validation": (422, "invalid_request_error", "Validation"),
    "input_too_long": (422, "invalid_request_error", "Validation"),
    "token_out_of_vocabulary": (422, "invalid_request_error", "Validation"),
    "tokenizer": (422, "invalid_request_error", "Tokenizer"),
    "overloaded": (429, "rate_limit_error", "Overloaded"),
    "internal": (500, "server_error", "Backend"),
    "unavailable": (503, "server_error", "Unhealthy"),
    "timeout": (504, "timeout_error", "Backend"),
}

# (style, reason) -> (status, TEI error_type) where a peer answers differently from REASONS:
# OpenAI and vLLM refuse an over-long input with 400; TEI answers a route its model cannot serve
# (e.g. /rerank on an embedder) with 424 Failed Dependency and error_type Backend.
STYLE_STATUS: dict[tuple[str, str], tuple[int, str]] = {
    (OPENAI, "input_too_long"): (400, "Validation"),
    (TEI, "wrong_model_kind"): (424, "Backend"),
}


@dataclass
class APIError(Exception):
    reason: str
    message: str
    param: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"unknown error reason {self.reason!r}")
        super().__init__(self.message)


def status_of(reason: str, style: str) -> int:
    """The HTTP status a reason gets on a route of this error style."""
    override = STYLE_STATUS.get((style, reason))
    return override[0] if override else REASONS[reason][0]


def render(error: APIError, style: str) -> Response:
    status, openai_type, tei_type = REASONS[error.reason]
    override = STYLE_STATUS.get((style, error.reason))
    if override:
        status, tei_type = override
    body: dict[str, Any]
    if style == OPENAI:
        body = {"error": {"message": error.message, "type": openai_type, "param": error.param, "code": error.reason}}
    else:
        body = {"error": error.message, "error_type": tei_type}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=error.headers)
