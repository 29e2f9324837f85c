"""Errors a request can meet, and how each API writes them.

Handlers raise APIError; the app renders it in the format of the API the route belongs to:
OpenAI's `{"error": {"message", "type", "param", "code"}}` for /v1/* routes, Text Embeddings
Inference's `{"error", "error_type"}` for the others. Every error is counted by route and reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.responses import Response

# reason -> (HTTP status, OpenAI error type, TEI error_type)
REASONS: dict[str, tuple[int, str, str]] = {
    "bad_json": (400, "invalid_request_error", "Validation"),
    "invalid_request": (400, "invalid_request_error", "Validation"),
    "empty_input": (400, "invalid_request_error", "Empty"),
    "wrong_model_kind": (400, "invalid_request_error", "Validation"),
    "unauthorized": (401, "authentication_error", "Unauthorized"),
    "not_found": (404, "invalid_request_error", "NotFound"),
    "method_not_allowed": (405, "invalid_request_error", "NotFound"),
    "body_too_large": (413, "invalid_request_error", "Validation"),
    "too_many_inputs": (413, "invalid_request_error", "Validation"),
    "validation": (422, "invalid_request_error", "Validation"),
    "input_too_long": (422, "invalid_request_error", "Validation"),
    "token_out_of_vocabulary": (422, "invalid_request_error", "Validation"),
    "tokenizer": (422, "invalid_request_error", "Tokenizer"),
    "overloaded": (429, "rate_limit_error", "Overloaded"),
    "internal": (500, "server_error", "Backend"),
    "unavailable": (503, "server_error", "Unhealthy"),
    "timeout": (504, "timeout_error", "Backend"),
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

    @property
    def status(self) -> int:
        return REASONS[self.reason][0]


def render(error: APIError, openai_style: bool) -> Response:
    status, openai_type, tei_type = REASONS[error.reason]
    body: dict[str, Any]
    if openai_style:
        body = {"error": {"message": error.message, "type": openai_type, "param": error.param, "code": error.reason}}
    else:
        body = {"error": error.message, "error_type": tei_type}
    return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=error.headers)
