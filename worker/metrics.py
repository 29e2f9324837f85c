"""The worker's Prometheus metrics, recorded where each event happens."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from common.metrics import LATENCY_BUCKETS, SEQUENCE_BUCKETS, TOKEN_BUCKETS

BATCH_SEQUENCES = Histogram("quiver_worker_batch_sequences", "Sequences per forward pass", buckets=SEQUENCE_BUCKETS)
BATCH_TOKENS = Histogram("quiver_worker_batch_tokens", "Tokens per forward pass", buckets=TOKEN_BUCKETS)
STEP_SECONDS = Histogram("quiver_worker_step_seconds", "Time from a batch's launch to its results on the host",
                         buckets=LATENCY_BUCKETS)
CHUNKS = Counter("quiver_worker_chunks_total", "Chunks finished, by outcome", ["outcome"])
QUEUE_DEPTH = Gauge("quiver_worker_queue_depth", "Sequences waiting in the scheduler")
INFLIGHT_CHUNKS = Gauge("quiver_worker_inflight_chunks", "Chunks accepted and not yet answered")
INFO = Gauge("quiver_worker_info", "Constant 1, labelled with what this worker serves", ["worker", "device", "model", "dtype"])
