"""The broker bounds what a peer can make it hold. An oversized frame gets its
sender disconnected before it is buffered; lost workers' metric series go away; a live worker that
sits on a chunk past its hold budget loses it to another worker, and its late answer is dropped."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import zmq

from quiver.common.protocol import MAX_FRAME_BYTES, Cancel, Chunk, Disconnect, Heartbeat, Result
from tests.security.wire_peers import Peer, make_chunk, make_result, start_broker


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_a_frame_over_the_protocols_limit_is_never_buffered_and_the_broker_serves_on():
    cluster = start_broker()
    ctx = zmq.Context()
    try:
        front = Peer(ctx, cluster.frontend_endpoint)
        assert front.live_workers() == 0
        before = rss_mib(cluster.broker.popen.pid)
        rogue_ctx = zmq.Context()  # its own I/O thread, busy with the big frame
        rogue = Peer(rogue_ctx, cluster.frontend_endpoint)
        rogue.sock.send_multipart([b"\x03", b"\x80", bytes(MAX_FRAME_BYTES + 1)])
        time.sleep(3)
        rogue_ctx.destroy(linger=0)
        assert rss_mib(cluster.broker.popen.pid) - before < MAX_FRAME_BYTES / 2**20 / 4
        assert cluster.broker.alive() and front.live_workers() == 0
    finally:
        ctx.destroy(linger=0)
        cluster.stop()


def test_lost_workers_leave_no_metric_series_behind():
    cluster = start_broker()
    ctx = zmq.Context()
    try:
        front = Peer(ctx, cluster.frontend_endpoint)
        front.send(Heartbeat())
        for i in range(30):
            worker = Peer(ctx, cluster.worker_endpoint)
            worker.register(f"transient-{i}")
            front.wait_workers(1)
            front.send(make_chunk(f"c{i}"))
            worker.send(make_result(worker.recv()))  # dispatched: the worker has a dispatch counter now
            assert isinstance(front.recv(), Result)
            worker.send(Disconnect(reason="bye"))
            worker.sock.close()
            front.wait_workers(0)
        text = httpx.get(cluster.metrics_url, timeout=5).text
        assert "transient-" not in text
    finally:
        ctx.destroy(linger=0)
        cluster.stop()


def test_a_chunk_held_too_long_by_a_live_worker_goes_to_another_and_the_late_answer_is_dropped():
    cluster = start_broker("--chunk-hold-s", "1.5", "--chunk-hold-tokens-per-s", "1000000")
    ctx = zmq.Context()
    try:
        front = Peer(ctx, cluster.frontend_endpoint)
        slow = Peer(ctx, cluster.worker_endpoint)
        slow.register("slow")
        front.wait_workers(1)
        front.send(make_chunk("c1"))
        first = slow.recv()
        assert isinstance(first, Chunk) and first.attempt == 0
        quick = Peer(ctx, cluster.worker_endpoint)
        quick.register("quick")
        front.wait_workers(2)
        second = None
        end = time.monotonic() + 10
        while not isinstance(second, Chunk) and time.monotonic() < end:
            slow.send(Heartbeat())  # alive all along: only the hold budget can take the chunk back
            quick.send(Heartbeat())
            second = quick.recv(0.3)
        assert isinstance(second, Chunk) and second.chunk_id == "c1" and second.attempt == 1
        assert isinstance(slow.recv(1.0), Cancel)
        slow.send(make_result(first, fill=-1.0))  # the late answer
        assert front.recv(0.7) is None
        quick.send(make_result(second, fill=3.0))
        answer = front.recv()
        assert isinstance(answer, Result) and float(answer.values[0, 0]) == 3.0
        text = httpx.get(cluster.metrics_url, timeout=5).text
        assert "quiver_broker_chunk_timeouts_total 1.0" in text
        assert "quiver_broker_duplicate_results_total 1.0" in text
    finally:
        ctx.destroy(linger=0)
        cluster.stop()
