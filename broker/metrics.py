"""The broker's Prometheus metrics, recorded where each event happens."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

CHUNKS_RECEIVED = Counter("quiver_broker_chunks_received_total", "Chunks received from frontends")
DISPATCHES = Counter("quiver_broker_dispatches_total", "Chunks sent to a worker, re-dispatches included", ["worker"])
REQUEUES = Counter("quiver_broker_requeues_total", "Chunks put back in the queue after their worker was lost")
DEAD_WORKERS = Counter("quiver_broker_dead_workers_total", "Workers dropped, by reason", ["reason"])
DUPLICATE_RESULTS = Counter("quiver_broker_duplicate_results_total", "Results dropped because their chunk was done")
DUPLICATE_CHUNKS = Counter("quiver_broker_duplicate_chunks_total", "Chunks dropped because the broker already held them")
CHUNK_FAILURES = Counter("quiver_broker_chunk_failures_total", "Chunks answered with an error, by code", ["code"])
BAD_MESSAGES = Counter("quiver_broker_bad_messages_total", "Messages dropped as malformed, by socket", ["peer"])
QUEUE_DEPTH = Gauge("quiver_broker_queue_depth", "Chunks waiting for a worker")
LIVE_WORKERS = Gauge("quiver_broker_live_workers", "Workers registered and heart-beating")
INFLIGHT_CHUNKS = Gauge("quiver_broker_inflight_chunks", "Chunks dispatched and not yet answered, per worker", ["worker"])
INFLIGHT_TOKENS = Gauge("quiver_broker_inflight_tokens", "Tokens dispatched and not yet answered, per worker", ["worker"])
WORKER_UP = Gauge("quiver_worker_up", "1 while the broker counts the worker live, 0 after it was lost", ["worker"])
