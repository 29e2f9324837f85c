"""Prometheus helpers shared by every process."""

from __future__ import annotations

import logging

from prometheus_client import start_http_server

log = logging.getLogger("quiver.metrics")

# Latency buckets from 0.1 ms to 10 s, roughly three per decade.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
# Token counts from one to a large batch, doubling.
TOKEN_BUCKETS = tuple(float(2**i) for i in range(0, 21))
SEQUENCE_BUCKETS = tuple(float(2**i) for i in range(0, 13))


def serve_metrics(port: int, host: str = "127.0.0.1") -> None:
    """Serve /metrics on its own port from a daemon thread; port 0 means none."""
    if port > 0:
        start_http_server(port, addr=host)
        log.info("metrics on http://%s:%d/metrics", host, port)
