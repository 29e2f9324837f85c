"""The worker's Prometheus metrics (common.metrics.CONTRACT lists them).

The scheduler records batches, steps and chunks where they happen. What the engine counts itself
(CUDA-graph warm-ups, captures, replays, graphs, GPU memory) is read from `engine.stats()` and
`engine.info` by EngineCollector when /metrics is scraped, so serving pays nothing for it.
Every sample is served with the worker's `worker` and `device` labels (worker/main.py).
"""

from __future__ import annotations

import logging
from typing import Any, Iterator

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from quiver.common.metrics import CONTRACT, LoopBeat, MetricSpec, define
from quiver.common.protocol import ErrorCode

log = logging.getLogger("quiver.worker.metrics")

INFO = define("quiver_worker_info")
BATCH_SEQUENCES = define("quiver_worker_batch_sequences")
BATCH_TOKENS = define("quiver_worker_batch_tokens")
STEP_SECONDS = define("quiver_worker_step_seconds")
STEP_CHUNKS = define("quiver_worker_step_chunks")
GPU_BUSY_SECONDS = define("quiver_worker_busy_seconds_total")
QUEUED_STEPS = define("quiver_worker_queued_steps_total")
CHUNKS = define("quiver_worker_chunks_total")
FAILED_BATCHES = define("quiver_worker_failed_batches_total")
BAD_MESSAGES = define("quiver_worker_bad_messages_total")
BROKER_RECONNECTS = define("quiver_worker_broker_reconnects_total")
QUEUE_DEPTH = define("quiver_worker_queue_depth")
INFLIGHT_CHUNKS = define("quiver_worker_inflight_chunks")
LOOP_TIMESTAMP = define("quiver_worker_loop_timestamp_seconds")

# Called once per scheduler-loop iteration; run_worker attaches systemd's watchdog to it.
loop_tick = LoopBeat(LOOP_TIMESTAMP)

for _outcome in ("ok", "cancelled", *(code.value for code in ErrorCode)):
    CHUNKS.labels(_outcome)
CHUNKS_OK = CHUNKS.labels("ok")  # every answered chunk counts here: the label looked up once
for _reason in ("out_of_memory", "error"):
    FAILED_BATCHES.labels(_reason)

# Contract name -> where its value comes from: a key of engine.stats(), or "info.<field>" of engine.info.
ENGINE_SOURCES: dict[str, str] = {
    "quiver_worker_max_batch_tokens": "info.max_batch_tokens",
    "quiver_worker_max_batch_sequences": "info.max_batch_seqs",
    "quiver_worker_graph_warmups_total": "warmups",
    "quiver_worker_graph_captures_total": "captures",
    "quiver_worker_graph_replays_total": "replays",
    "quiver_worker_graph_capture_failures_total": "capture_failures",
    "quiver_worker_eager_steps_total": "eager_steps",
    "quiver_worker_eager_new_shapes_total": "eager_new_shapes",
    "quiver_worker_eager_warmups_total": "eager_warmups",
    "quiver_worker_graphs": "graphs",
    "quiver_worker_graph_pool_bytes": "graph_pool_bytes",
    "quiver_worker_gpu_memory_allocated_bytes": "gpu_allocated_bytes",
    "quiver_worker_gpu_memory_reserved_bytes": "gpu_reserved_bytes",
    "quiver_worker_gpu_memory_budget_bytes": "info.gpu_budget_bytes",
    "quiver_worker_gpu_memory_total_bytes": "info.gpu_total_bytes",
    "quiver_worker_weights_bytes": "weights_bytes",
    "quiver_worker_activation_peak_bytes": "activation_peak_bytes",
    "quiver_worker_startup_seconds": "info.startup_seconds",
}
# Absent from engine.stats() on a CPU worker: exported as 0 there.
GPU_ONLY = {"gpu_allocated_bytes", "gpu_reserved_bytes"}


class EngineCollector(Collector):
    """engine.stats() and engine.info as metrics, read at scrape time (from the HTTP server's thread)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.specs: list[MetricSpec] = [entry for entry in CONTRACT if entry.engine]
        self.last_stats: dict[str, Any] = {}

    def _stats(self) -> dict[str, Any]:
        # The scheduler thread may be stepping meanwhile; stats() reads counters and sizes, and one
        # retry covers a dict that changed size while it was read.
        for _ in range(2):
            try:
                self.last_stats = dict(self.engine.stats())
                break
            except RuntimeError:
                continue
            except Exception:
                log.exception("engine.stats() failed; serving its last values")
                break
        return self.last_stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        info = self.engine.info
        for entry in self.specs:
            source = ENGINE_SOURCES[entry.name]
            if source.startswith("info."):
                value = getattr(info, source[5:], None)
            else:
                value = stats.get(source, 0 if source in GPU_ONLY else None)
            if value is None:
                continue  # the engine no longer reports it: the contract test says so
            if entry.kind == "counter":
                family: CounterMetricFamily | GaugeMetricFamily = CounterMetricFamily(entry.family, entry.help)
            else:
                family = GaugeMetricFamily(entry.name, entry.help)
            family.add_metric([], float(value))
            yield family


def watch_engine(engine: Any, registry: CollectorRegistry = REGISTRY) -> EngineCollector:
    collector = EngineCollector(engine)
    registry.register(collector)
    return collector
