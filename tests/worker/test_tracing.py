"""The worker's chunk spans, from the scheduler driving the real engine on CPU, exported over OTLP/HTTP to
a collector in the test: answered and expired chunks with a traceparent get a span that joins the trace;
chunks without one, or with a malformed one, run as any other and write nothing."""

from __future__ import annotations

import queue
import secrets
import threading

import numpy as np
import pytest

pytest.importorskip("opentelemetry.sdk.trace")
pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")

from quiver.common.model_info import default_model_dir
from quiver.common.protocol import Chunk, Error, Message, Result
from quiver.worker.engine import load_engine
from quiver.worker.scheduler import Scheduler
from quiver.worker.tracing import chunk_tracer
from tests.otlp_collector import CONSUMER, STATUS_ERROR, STATUS_UNSET, Collector


def _chunk(chunk_id: str, lens: list[int], traceparent: str, timeout_s: float = 30.0) -> Chunk:
    rng = np.random.default_rng(len(chunk_id))
    return Chunk(chunk_id=chunk_id, task="embed", num_seqs=len(lens), num_tokens=sum(lens), normalize=True,
                 timeout_s=timeout_s, input_ids=rng.integers(1000, 20000, size=sum(lens), dtype=np.int32),
                 seq_lens=np.array(lens, dtype=np.int32), traceparent=traceparent)


def test_scheduler_writes_one_span_per_traced_chunk():
    collector = Collector()
    try:
        tracer = chunk_tracer(collector.url, "", "cpu-test")
        assert tracer is not None
        engine = load_engine(default_model_dir(), device="cpu")
        sent: list[Message] = []
        # A budget of 64 tokens: the 2 x 40-token chunk takes two steps.
        scheduler = Scheduler(engine, send=sent.append, worker_name="cpu-test", max_batch_tokens=64,
                              max_batch_seqs=8, chunk_tracer=tracer)
        trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
        traceparent = f"00-{trace_id}-{parent_id}-01"
        chunks = [_chunk("traced", [40, 40], traceparent), _chunk("late", [5], traceparent, timeout_s=-1.0),
                  _chunk("plain", [6], ""), _chunk("malformed", [7], "00-" + "g" * 32 + "-" + "1" * 16 + "-01")]
        inbox: queue.Queue = queue.Queue()
        for chunk in chunks:
            inbox.put(chunk)
        stop, drain = threading.Event(), threading.Event()
        drain.set()
        loop = threading.Thread(target=scheduler.run, args=(inbox, stop, drain), daemon=True)
        loop.start()
        loop.join(timeout=120)
        assert not loop.is_alive()
        answers = {m.chunk_id: type(m) for m in sent}
        assert answers == {"traced": Result, "late": Error, "plain": Result, "malformed": Result}
        tracer.shutdown()  # exports what is queued

        spans = collector.wait_for(lambda spans: len(spans) >= 2, timeout=30)
        by_chunk = {span.attributes["quiver.chunk_id"]: span for span in spans}
        assert sorted(by_chunk) == ["late", "traced"]
        for span in by_chunk.values():
            assert span.service == "quiver-worker" and span.name == "worker.chunk" and span.kind == CONSUMER
            assert span.trace_id == trace_id and span.parent_span_id == parent_id
            assert span.attributes["quiver.worker"] == "cpu-test"
        traced, late = by_chunk["traced"], by_chunk["late"]
        assert traced.status == STATUS_UNSET and late.status == STATUS_ERROR
        assert traced.attributes["quiver.rows"] == 2 and traced.attributes["quiver.tokens"] == 80
        assert traced.attributes["quiver.steps"] == 2 and late.attributes["quiver.steps"] == 0
        result = next(m for m in sent if isinstance(m, Result) and m.chunk_id == "traced")
        assert traced.attributes["quiver.inference_s"] == pytest.approx(result.inference_s)
        assert traced.attributes["quiver.queue_s"] == pytest.approx(result.queue_s)
        assert traced.end_ns - traced.start_ns >= int(result.inference_s * 1e9)
    finally:
        collector.close()
