"""OpenTelemetry tracing end to end: a real broker, worker and frontend export OTLP/HTTP protobuf to a
collector in this test, which decodes every POST /v1/traces with opentelemetry-proto.

A request's span in the frontend joins the client's trace (W3C traceparent), its tokenize, queue and
inference children share it, and each worker's span of a chunk joins it through the chunk's header.
"""

from __future__ import annotations

import secrets
from typing import Callable

import httpx
import numpy as np
import pytest
import zmq

pytest.importorskip("opentelemetry.sdk.trace")
pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")

from quiver.common.protocol import Chunk, Result
from tests.cluster import Cluster, free_port
from tests.otlp_collector import CONSUMER, SERVER, STATUS_ERROR, STATUS_UNSET, Collector, ReceivedSpan
from tests.security.wire_peers import Peer

TOKEN_IDS = [101, 7592, 2088, 102]  # [CLS] hello world [SEP] in the packaged model's vocabulary


@pytest.fixture(scope="module")
def collector():
    instance = Collector()
    yield instance
    instance.close()


@pytest.fixture(scope="module")
def traced(collector):
    """One CPU worker and a frontend that cuts chunks of two sequences, both exporting to the collector:
    the frontend given the collector's base URL, the worker its full /v1/traces URL."""
    cluster = Cluster(workers=1, env={"OTEL_BSP_SCHEDULE_DELAY": "100"},
                      frontend_args=["--otlp-endpoint", collector.url, "--max-chunk-seqs", "2"],
                      worker_args=["--otlp-endpoint", collector.url + "/v1/traces"])
    cluster.start()
    cluster.served_model = httpx.get(cluster.url + "/v1/models", timeout=30).json()["data"][0]["id"]  # type: ignore[attr-defined]
    yield cluster
    cluster.stop()
    # The traced processes flushed their spans and stopped cleanly (uvicorn ends on the signal it was sent).
    assert cluster.worker_procs[0].popen.returncode == 0, cluster.logs()
    assert "Application shutdown complete" in cluster.frontend.log() and "Traceback" not in cluster.logs()


def new_traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def in_trace(spans: list[ReceivedSpan], trace_id: str) -> list[ReceivedSpan]:
    return [span for span in spans if span.trace_id == trace_id]


def request_span(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [span for span in spans if span.name == name and span.kind == SERVER]
    assert len(found) == 1, [(s.name, s.kind) for s in spans]
    return found[0]


def complete(trace_id: str, chunks: int) -> Callable[[list[ReceivedSpan]], bool]:
    """The request's span and the workers' spans of all its chunks have arrived."""
    def check(spans: list[ReceivedSpan]) -> bool:
        mine = in_trace(spans, trace_id)
        return (any(s.kind == SERVER for s in mine)
                and sum(1 for s in mine if s.name == "worker.chunk") >= chunks)
    return check


def check_request_trace(spans: list[ReceivedSpan], route: str, tokens: int, inputs: int, model: str) -> ReceivedSpan:
    """The request span's attributes, its stage children and the worker spans of its chunks."""
    request = request_span(spans, f"POST {route}")
    assert request.service == "quiver-frontend"
    assert request.attributes["http.request.method"] == "POST"
    assert request.attributes["http.route"] == route
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["quiver.model"] == model
    assert request.attributes["quiver.request.sequences"] == inputs
    assert request.attributes["quiver.request.tokens"] == tokens
    assert request.status == STATUS_UNSET
    children = {s.name: s for s in spans if s.parent_span_id == request.span_id and s.service == "quiver-frontend"}
    assert {"tokenize", "queue", "inference"} <= set(children), list(children)
    for child in children.values():
        assert request.start_ns <= child.start_ns <= child.end_ns <= request.end_ns, child
    assert children["tokenize"].end_ns <= children["queue"].start_ns
    assert children["queue"].end_ns == children["inference"].start_ns
    assert children["queue"].attributes["quiver.chunks"] == (inputs + 1) // 2
    assert children["inference"].attributes["quiver.workers"] == ["cpu-0"]

    workers = [s for s in spans if s.name == "worker.chunk"]
    assert len(workers) == (inputs + 1) // 2
    frontend_ids = {s.span_id for s in spans if s.service == "quiver-frontend"}
    for span in workers:
        assert span.service == "quiver-worker" and span.kind == CONSUMER
        assert span.parent_span_id in frontend_ids
        assert span.attributes["quiver.worker"] == "cpu-0"
        assert span.attributes["quiver.steps"] >= 1
        assert span.attributes["quiver.inference_s"] > 0
        assert span.start_ns < span.end_ns
    assert sum(s.attributes["quiver.rows"] for s in workers) == inputs
    assert sum(s.attributes["quiver.tokens"] for s in workers) == tokens
    assert len({s.attributes["quiver.chunk_id"] for s in workers}) == len(workers)
    return request


def test_openai_request_joins_the_clients_trace(traced, collector):
    traceparent, trace_id, parent_id = new_traceparent()
    texts = ["tracing one", "tracing two", "tracing three"]
    response = httpx.post(traced.url + "/v1/embeddings", json={"input": texts},
                          headers={"traceparent": traceparent}, timeout=60)
    assert response.status_code == 200, response.text
    tokens = response.json()["usage"]["prompt_tokens"]
    spans = in_trace(collector.wait_for(complete(trace_id, chunks=2)), trace_id)
    request = check_request_trace(spans, "/v1/embeddings", tokens, len(texts), traced.served_model)
    assert request.parent_span_id == parent_id


def test_tei_request_with_token_ids_joins_the_clients_trace(traced, collector):
    traceparent, trace_id, parent_id = new_traceparent()
    response = httpx.post(traced.url + "/embed", json={"inputs": [TOKEN_IDS, TOKEN_IDS[:3]]},
                          headers={"traceparent": traceparent}, timeout=60)
    assert response.status_code == 200, response.text
    spans = in_trace(collector.wait_for(complete(trace_id, chunks=1)), trace_id)
    request = check_request_trace(spans, "/embed", len(TOKEN_IDS) + 3, 2, traced.served_model)
    assert request.parent_span_id == parent_id


@pytest.mark.parametrize("header", [None, "not-a-traceparent", "00-" + "0" * 32 + "-" + "1" * 16 + "-01"])
def test_without_a_valid_traceparent_a_fresh_trace_starts(traced, collector, header):
    before = {span.trace_id for span in collector.spans}
    response = httpx.post(traced.url + "/v1/embeddings", json={"input": ["a fresh trace"]},
                          headers={"traceparent": header} if header else {}, timeout=60)
    assert response.status_code == 200, response.text

    def fresh(spans: list[ReceivedSpan]) -> bool:
        return any(s.kind == SERVER and s.parent_span_id == "" and s.trace_id not in before
                   and complete(s.trace_id, chunks=1)(spans) for s in spans)

    spans = collector.wait_for(fresh)
    request = next(s for s in spans if s.kind == SERVER and s.parent_span_id == "" and s.trace_id not in before)
    check_request_trace(in_trace(spans, request.trace_id), "/v1/embeddings",
                        response.json()["usage"]["prompt_tokens"], 1, traced.served_model)


def test_client_mistake_is_named_on_the_span_and_sends_nothing_to_workers(traced, collector):
    traceparent, trace_id, _ = new_traceparent()
    response = httpx.post(traced.url + "/v1/embeddings", json={"input": []}, headers={"traceparent": traceparent},
                          timeout=60)
    assert response.status_code == 400
    spans = in_trace(collector.wait_for(lambda spans: any(s.trace_id == trace_id for s in spans)), trace_id)
    request = request_span(spans, "POST /v1/embeddings")
    assert request.attributes["http.response.status_code"] == 400
    assert request.attributes["error.type"] == "empty_input"
    assert request.status == STATUS_UNSET  # a 4xx is the client's error, not the server span's
    assert not [s for s in spans if s.name in ("queue", "inference", "worker.chunk")]


def test_server_error_marks_the_span_and_its_queue_stage(traced, collector):
    """A frontend whose deadline passes before any result can come answers 504: its span is in error, and
    so is the queue stage its chunks were in."""
    _, url = traced.extra_frontend(["--otlp-endpoint", collector.url, "--request-timeout-s", "0.000001"])
    traceparent, trace_id, _ = new_traceparent()
    response = httpx.post(url + "/v1/embeddings", json={"input": ["too late"]}, headers={"traceparent": traceparent},
                          timeout=60)
    assert response.status_code == 504, response.text
    spans = in_trace(collector.wait_for(lambda spans: any(s.trace_id == trace_id and s.kind == SERVER
                                                         for s in spans)), trace_id)
    request = request_span(spans, "POST /v1/embeddings")
    assert request.attributes["http.response.status_code"] == 504
    assert request.attributes["error.type"] == "timeout"
    assert request.status == STATUS_ERROR
    queue = next(s for s in spans if s.name == "queue")
    assert queue.parent_span_id == request.span_id and queue.status == STATUS_ERROR


def test_requests_are_answered_while_the_collector_is_down(traced):
    """Spans for a collector that refuses connections are dropped by the exporter's thread, not by requests."""
    closed = free_port()
    _, url = traced.extra_frontend(["--otlp-endpoint", f"http://127.0.0.1:{closed}"])
    for index in range(5):
        traceparent, _, _ = new_traceparent()
        response = httpx.post(url + "/v1/embeddings", json={"input": [f"collector down {index}"]},
                              headers={"traceparent": traceparent}, timeout=30)
        assert response.status_code == 200, response.text
        assert len(response.json()["data"][0]["embedding"]) == 384


def test_worker_ignores_a_malformed_traceparent_on_a_chunk(traced, collector):
    """A chunk from another peer with a traceparent that is not W3C's runs as any other, and writes no span."""
    ctx = zmq.Context()
    peer = Peer(ctx, traced.frontend_endpoint)
    try:
        ids = np.array(TOKEN_IDS, dtype=np.int32)
        bad_id, good_id = secrets.token_hex(16), secrets.token_hex(16)
        good_parent, good_trace, _ = new_traceparent()
        for chunk_id, traceparent in ((bad_id, "00-zz-not-hex-01"), (good_id, good_parent)):
            peer.send(Chunk(chunk_id=chunk_id, task="embed", num_seqs=1, num_tokens=len(TOKEN_IDS), normalize=True,
                            timeout_s=30.0, input_ids=ids, seq_lens=np.array([len(TOKEN_IDS)], dtype=np.int32),
                            traceparent=traceparent))
        answers = [peer.recv(timeout=30), peer.recv(timeout=30)]
        assert all(isinstance(answer, Result) and answer.values.shape == (1, 384) for answer in answers), answers
        assert {answer.chunk_id for answer in answers} == {bad_id, good_id}
    finally:
        peer.sock.close(linger=0)
        ctx.term()
    # The worker exports in order: once the later chunk's span is in, the earlier one's would be too.
    spans = collector.wait_for(lambda spans: any(s.trace_id == good_trace for s in spans))
    assert [s.attributes["quiver.chunk_id"] for s in spans if s.name == "worker.chunk"
            and s.attributes["quiver.chunk_id"] in (bad_id, good_id)] == [good_id]
