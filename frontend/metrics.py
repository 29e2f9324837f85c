"""The frontend's Prometheus metrics, recorded where each event happens."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from common.metrics import LATENCY_BUCKETS, TOKEN_BUCKETS

REQUESTS = Counter("quiver_requests_total", "HTTP requests answered, by route and status", ["route", "status"])
FAILURES = Counter("quiver_request_failures_total", "HTTP requests that failed, by route and reason", ["route", "reason"])
STAGE_SECONDS = Histogram(
    "quiver_request_stage_seconds", "Time a request spent in each stage: tokenization, queue, inference, total",
    ["route", "stage"], buckets=LATENCY_BUCKETS,
)
INPUT_TOKENS = Histogram("quiver_request_input_tokens", "Input tokens per request", ["route"], buckets=TOKEN_BUCKETS)
INPUTS = Histogram("quiver_request_inputs", "Inputs per request", ["route"],
                   buckets=tuple(float(2**i) for i in range(0, 13)))
INFLIGHT_TOKENS = Gauge("quiver_frontend_inflight_tokens", "Tokens of requests this frontend is serving")
LIVE_WORKERS = Gauge("quiver_frontend_live_workers", "Live workers, as the broker last reported")
CHUNKS_SENT = Counter("quiver_frontend_chunks_total", "Chunks sent to the broker")
CHUNKS_RESENT = Counter("quiver_frontend_chunks_resent_total", "Chunks sent again after the broker came back")
BAD_MESSAGES = Counter("quiver_frontend_bad_messages_total", "Malformed messages from the broker")
