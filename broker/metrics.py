"""The broker's Prometheus metrics, recorded where each event happens (common.metrics.CONTRACT lists them)."""

from __future__ import annotations

import logging
import time

from quiver.common.metrics import LoopBeat, define
from quiver.common.protocol import ErrorCode

log = logging.getLogger("quiver.broker")

CHUNKS_RECEIVED = define("quiver_broker_chunks_received_total")
DISPATCHES = define("quiver_broker_dispatches_total")
REQUEUES = define("quiver_broker_requeues_total")
CHUNK_TIMEOUTS = define("quiver_broker_chunk_timeouts_total")
REFUSED = define("quiver_broker_refused_messages_total")
DEAD_WORKERS = define("quiver_broker_dead_workers_total")
DUPLICATE_RESULTS = define("quiver_broker_duplicate_results_total")
DUPLICATE_CHUNKS = define("quiver_broker_duplicate_chunks_total")
CHUNK_FAILURES = define("quiver_broker_chunk_failures_total")
BAD_MESSAGES = define("quiver_broker_bad_messages_total")
QUEUE_DEPTH = define("quiver_broker_queue_depth")
LIVE_WORKERS = define("quiver_broker_live_workers")
INFLIGHT_CHUNKS = define("quiver_broker_inflight_chunks")
INFLIGHT_TOKENS = define("quiver_broker_inflight_tokens")
WORKER_UP = define("quiver_broker_worker_up")
LOOP_TIMESTAMP = define("quiver_broker_loop_timestamp_seconds")

# Called once per poll-loop iteration; run_broker attaches systemd's watchdog to it.
loop_tick = LoopBeat(LOOP_TIMESTAMP)

# Known label values start at zero, so rates and alerts see a series before the first event.
for _reason in ("silent", "left"):
    DEAD_WORKERS.labels(_reason)
for _code in ErrorCode:
    CHUNK_FAILURES.labels(_code.value)
for _peer in ("frontend", "worker"):
    BAD_MESSAGES.labels(_peer)
for _message, _reason in (
    ("RESULT", "unregistered"), ("RESULT", "not_assigned"), ("RESULT", "rows"), ("RESULT", "dim"),
    ("RESULT", "dtype"), ("ERROR", "unregistered"), ("ERROR", "not_assigned"), ("CANCEL", "not_owner"),
    ("READY", "secret"), ("READY", "version"), ("READY", "model"), ("CHUNK", "model"),
):
    REFUSED.labels(_message, _reason)


# A refusal reason is logged at most once per this many seconds (a flood must not flood the log).
REFUSAL_LOG_INTERVAL_S = 10.0


class Refusals:
    """Counts refusals in the metric and logs each (message, reason) at most once per interval."""

    def __init__(self, interval_s: float = REFUSAL_LOG_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.last: dict[tuple[str, str], float] = {}
        self.suppressed: dict[tuple[str, str], int] = {}

    def refuse(self, message: str, reason: str, text: str, *args: object) -> None:
        REFUSED.labels(message, reason).inc()
        self.warn(message, reason, text, *args)

    def warn(self, message: str, reason: str, text: str, *args: object) -> None:
        key = (message, reason)
        now = time.monotonic()
        if now - self.last.get(key, float("-inf")) < self.interval_s:
            self.suppressed[key] = self.suppressed.get(key, 0) + 1
            return
        self.last[key] = now
        more = self.suppressed.pop(key, 0)
        log.warning("refused a %s: " + text + (f" ({more} more like it not logged)" if more else ""),
                    message, *args)


def forget_worker(name: str) -> None:
    """Remove a lost worker's label sets, so names that come and go do not pile up series."""
    for metric in (WORKER_UP, INFLIGHT_CHUNKS, INFLIGHT_TOKENS, DISPATCHES):
        try:
            metric.remove(name)
        except KeyError:
            pass
