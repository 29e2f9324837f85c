"""In-flight admission: the tokens a frontend process holds, reserved before the body is parsed.

A request reserves an estimate from its body's size before anything is parsed or tokenized, so an
overloaded server answers 429 before its memory grows. Once tokenized, the request settles its
reservation to the exact token count (429 if that no longer fits beside the others) and releases it
when it ends. One request is always admitted when nothing else is in flight, so a request larger
than the limit is served alone rather than never.
"""

from __future__ import annotations

import contextvars

from quiver.frontend import metrics
from quiver.frontend.errors import APIError

RETRY_AFTER_S = "1"
# JSON text averages more than four bytes per token for natural language (about 4.5 characters per
# token, plus quoting); token-id arrays take 2–7 bytes per id. A guess, corrected after tokenization.
BYTES_PER_TOKEN = 4


def estimated_tokens(body_bytes: int) -> int:
    return body_bytes // BYTES_PER_TOKEN + 1


class Admission:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.inflight = 0

    def _check(self, tokens: int, others: int, what: str) -> None:
        if others and others + tokens > self.limit:
            raise APIError("overloaded",
                           f"this server holds {others} tokens in flight (limit {self.limit}) and this request "
                           f"{what} {tokens}; retry later", headers={"Retry-After": RETRY_AFTER_S})

    def _add(self, tokens: int) -> None:
        self.inflight += tokens
        metrics.INFLIGHT_TOKENS.set(self.inflight)

    def reserve(self, tokens: int, estimated: bool) -> Ticket:
        """Hold `tokens` for a request, or raise 429 when they do not fit beside what is in flight."""
        self._check(tokens, self.inflight, "would add about" if estimated else "adds")
        self._add(tokens)
        return Ticket(self, tokens)


class Ticket:
    """One request's share of the in-flight tokens."""

    def __init__(self, admission: Admission, tokens: int) -> None:
        self.admission = admission
        self.tokens = tokens

    def settle(self, exact: int) -> None:
        """Swap the reservation for the request's exact token count (429 if that no longer fits)."""
        self.admission._check(exact, self.admission.inflight - self.tokens, "adds")
        self.admission._add(exact - self.tokens)
        self.tokens = exact

    def release(self) -> None:
        self.admission._add(-self.tokens)
        self.tokens = 0


# The ticket of the request the current task serves (set by the request prologue in frontend/http.py).
CURRENT_TICKET: contextvars.ContextVar[Ticket | None] = contextvars.ContextVar("quiver_ticket", default=None)
