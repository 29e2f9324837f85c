"""The broker process, driven over ZeroMQ by test peers that speak the protocol as frontends and
workers do: registration, least-loaded dispatch, the bounded queue, liveness and routing."""

from __future__ import annotations

import time

import msgpack
import numpy as np
import pytest
import zmq

from quiver.bench.local_server import cpu_seconds
from quiver.common.protocol import (
    PROTOCOL_VERSION, Chunk, Disconnect, Error, Heartbeat, Ready, Reconnect, Result,
)
from tests.cluster import Cluster
from tests.security.wire_peers import Peer as SecurityPeer

INTERVAL = 0.2


class Peer(SecurityPeer):
    """tests/security's peer, registering with this file's defaults: no secret, width 2, a capacity."""

    def register(self, name: str, capacity: int = 1000, output_dim: int = 2, secret: str = "") -> None:
        self.send(Ready(version=PROTOCOL_VERSION, name=name, model="m", device="cpu", capacity_tokens=capacity,
                        output_dim=output_dim, secret=secret, tasks=["embed"], pid=1))


def chunk(chunk_id: str, tokens: int = 10) -> Chunk:
    return Chunk(chunk_id=chunk_id, task="embed", num_seqs=1, num_tokens=tokens, normalize=True, timeout_s=30.0,
                 input_ids=np.arange(tokens, dtype=np.int32), seq_lens=np.array([tokens], dtype=np.int32))


def result_for(message: Chunk, worker: str = "w") -> Result:
    return Result(chunk_id=message.chunk_id, num_seqs=message.num_seqs, dim=2, worker=worker,
                  values=np.full((message.num_seqs, 2), 1.5, dtype=np.float32))


@pytest.fixture
def broker():
    cluster = Cluster(workers=0, heartbeat_interval_s=INTERVAL, broker_args=["--max-queued-chunks", "3"])
    cluster.start_broker()
    ctx = zmq.Context()
    yield cluster, ctx
    ctx.destroy(linger=0)
    cluster.stop()


def live_workers(frontend: Peer) -> int:
    frontend.send(Heartbeat())
    reply = frontend.recv(skip_heartbeats=False)
    assert isinstance(reply, Heartbeat)
    return reply.live_workers


def wait_workers(frontend: Peer, count: int) -> None:
    end = time.monotonic() + 5
    while live_workers(frontend) != count:
        assert time.monotonic() < end, f"broker never reported {count} workers"
        time.sleep(0.05)


def test_routes_chunks_to_the_least_loaded_worker_and_results_to_their_frontend(broker):
    cluster, ctx = broker
    front_a = Peer(ctx, cluster.frontend_endpoint, b"front-a")
    front_b = Peer(ctx, cluster.frontend_endpoint, b"front-b")
    w1 = Peer(ctx, cluster.worker_endpoint, b"w1")
    w2 = Peer(ctx, cluster.worker_endpoint, b"w2")
    w1.register("w1")
    w2.register("w2")
    wait_workers(front_a, 2)

    front_a.send(chunk("a:1", tokens=100))
    took_first = {name: peer.recv(0.5) for name, peer in (("w1", w1), ("w2", w2))}
    busy = [name for name, message in took_first.items() if message is not None]
    assert len(busy) == 1 and took_first[busy[0]].chunk_id == "a:1"
    idle_name = "w2" if busy[0] == "w1" else "w1"
    receiver = w1 if idle_name == "w1" else w2
    # The next chunk goes to the worker with fewer outstanding tokens: the idle one.
    front_b.send(chunk("b:1", tokens=10))
    second = receiver.recv()
    assert isinstance(second, Chunk) and second.chunk_id == "b:1"

    receiver.send(result_for(second))
    answer = front_b.recv()
    assert isinstance(answer, Result) and answer.chunk_id == "b:1"
    np.testing.assert_array_equal(answer.values, np.full((1, 2), 1.5, dtype=np.float32))
    assert front_a.recv(0.3) is None  # nothing for the other frontend


def test_least_loaded_dispatch_spreads_chunks(broker):
    cluster, ctx = broker
    front = Peer(ctx, cluster.frontend_endpoint, b"front")
    workers = {name: Peer(ctx, cluster.worker_endpoint, name.encode()) for name in ("w1", "w2")}
    for name, peer in workers.items():
        peer.register(name)
    wait_workers(front, 2)
    for i in range(4):
        front.send(chunk(f"f:{i}", tokens=100))
    received = {name: [] for name in workers}
    for name, peer in workers.items():
        while (message := peer.recv(0.5)) is not None:
            received[name].append(message.chunk_id)
    assert sorted(received["w1"] + received["w2"]) == [f"f:{i}" for i in range(4)]
    assert len(received["w1"]) == len(received["w2"]) == 2


def test_queue_is_bounded_and_waits_for_capacity(broker):
    cluster, ctx = broker
    front = Peer(ctx, cluster.frontend_endpoint, b"front")
    worker = Peer(ctx, cluster.worker_endpoint, b"w1")
    worker.register("w1", capacity=50)
    wait_workers(front, 1)
    front.send(chunk("f:0", tokens=40))  # dispatched: the worker is idle
    assert worker.recv().chunk_id == "f:0"
    for i in range(1, 5):  # capacity is used up: three wait, the fourth is refused
        front.send(chunk(f"f:{i}", tokens=40))
    refused = front.recv()
    assert isinstance(refused, Error) and refused.chunk_id == "f:4" and refused.code == "overloaded"
    assert worker.recv(0.3) is None
    worker.send(result_for(chunk("f:0")))
    assert front.recv().chunk_id == "f:0"
    assert worker.recv().chunk_id == "f:1"  # the queue moves, first in first out


def test_silent_worker_is_dropped_and_its_chunk_goes_elsewhere(broker):
    cluster, ctx = broker
    front = Peer(ctx, cluster.frontend_endpoint, b"front")
    silent = Peer(ctx, cluster.worker_endpoint, b"silent")
    silent.register("silent")
    wait_workers(front, 1)
    front.send(chunk("f:0"))
    assert silent.recv().chunk_id == "f:0"
    healthy = Peer(ctx, cluster.worker_endpoint, b"healthy")
    healthy.register("healthy")
    # The healthy worker heartbeats; the silent one stops after its READY.
    end = time.monotonic() + 5
    requeued = None
    while time.monotonic() < end and requeued is None:
        healthy.send(Heartbeat())
        requeued = healthy.recv(INTERVAL)
    assert isinstance(requeued, Chunk) and requeued.chunk_id == "f:0" and requeued.attempt == 1
    healthy.send(result_for(requeued))
    assert front.recv().chunk_id == "f:0"
    silent.send(result_for(requeued))  # a late duplicate from the worker thought dead
    assert front.recv(0.5) is None
    assert live_workers(front) == 1


def test_version_mismatch_is_refused_and_unknown_worker_told_to_reconnect(broker):
    cluster, ctx = broker
    old = Peer(ctx, cluster.worker_endpoint, b"old")
    old.send(Ready(version=PROTOCOL_VERSION + 1, name="old", model="m", device="cpu", capacity_tokens=10,
                   output_dim=2, pid=1))
    refusal = old.recv()
    assert isinstance(refusal, Disconnect) and "protocol version" in refusal.reason
    stranger = Peer(ctx, cluster.worker_endpoint, b"stranger")
    stranger.send(Heartbeat())
    assert isinstance(stranger.recv(), Reconnect)


def test_malformed_messages_do_not_hurt_the_broker(broker):
    cluster, ctx = broker
    front = Peer(ctx, cluster.frontend_endpoint, b"front")
    for junk in ([b"\x03", b"garbage"], [b"\xff"], [b"\x03", b"\x80", b"\x00" * 10], [b"x" * 100000]):
        front.sock.send_multipart(junk)
    worker = Peer(ctx, cluster.worker_endpoint, b"w")
    worker.sock.send_multipart([b"\x01", b"\x80"])
    # Fields that must name one of a few strings, sent as a list or a map (unhashable where a set or a
    # dict is asked whether it holds them): a READY's output_dtype, a RESULT's dtype, an ERROR's code.
    ready = [bytes(f) for f in Ready(version=PROTOCOL_VERSION, name="w", model="m", device="cpu", capacity_tokens=1000,
                                     output_dim=2, tasks=["embed"], pid=1).encode()]
    worker.sock.send_multipart([ready[0], msgpack.packb({**msgpack.unpackb(ready[1]), "output_dtype": {"a": 1}})])
    worker.sock.send_multipart([b"\x04", msgpack.packb({"chunk_id": "x", "num_seqs": 1, "dim": 2, "dtype": [1]}),
                                b"\x00" * 8])
    worker.sock.send_multipart([b"\x05", msgpack.packb({"chunk_id": "x", "code": ["internal"], "message": "m"})])
    worker.register("w")
    wait_workers(front, 1)
    assert cluster.broker.alive()


def test_requests_wait_in_the_queue_until_a_worker_comes(broker):
    cluster, ctx = broker
    front = Peer(ctx, cluster.frontend_endpoint, b"front")
    front.send(chunk("f:early"))
    time.sleep(0.3)
    late = Peer(ctx, cluster.worker_endpoint, b"late")
    late.register("late")
    assert late.recv().chunk_id == "f:early"


def test_a_chunk_that_waited_in_the_queue_carries_the_time_it_has_left(broker):
    cluster, ctx = broker
    front = Peer(ctx, cluster.frontend_endpoint, b"front")
    wait_workers(front, 0)
    front.send(chunk("f:waits"))  # no worker yet: it waits in the broker's queue
    time.sleep(0.5)
    worker = Peer(ctx, cluster.worker_endpoint, b"w")
    worker.register("w")
    waited = worker.recv()
    assert isinstance(waited, Chunk) and waited.chunk_id == "f:waits"
    assert waited.timeout_s <= 30.0 - 0.4
    np.testing.assert_array_equal(waited.input_ids, np.arange(10, dtype=np.int32))
    front.send(chunk("f:at-once"))  # a worker is free: it goes out as the frontend packed it
    at_once = worker.recv()
    assert isinstance(at_once, Chunk) and at_once.chunk_id == "f:at-once" and at_once.timeout_s == 30.0
    np.testing.assert_array_equal(at_once.input_ids, np.arange(10, dtype=np.int32))
    worker.send(result_for(waited))
    worker.send(result_for(at_once))
    assert {front.recv().chunk_id, front.recv().chunk_id} == {"f:waits", "f:at-once"}


def test_an_idle_broker_sleeps_between_its_heartbeats():
    """Waiting for its next heartbeat, the broker sleeps the whole time: it does not poll without sleeping
    through the last millisecond before each one (a busy loop of a tenth of a core at this interval, on top
    of the 1.5-5.5 % that waking 100 times a second costs on a 2-core machine, idle or under a test run)."""
    cluster = Cluster(workers=0, heartbeat_interval_s=0.01)
    broker_process = cluster.start_broker()
    ctx = zmq.Context()
    try:
        wait_workers(Peer(ctx, cluster.frontend_endpoint, b"front"), 0)  # it is up
        time.sleep(0.5)
        assert broker_process.popen is not None
        started = cpu_seconds(broker_process.popen.pid)
        time.sleep(3.0)
        share = (cpu_seconds(broker_process.popen.pid) - started) / 3.0
        assert share < 0.08, f"the idle broker took {share:.1%} of a core"
    finally:
        ctx.destroy(linger=0)
        cluster.stop()


def test_an_idle_broker_polls_once_per_heartbeat(monkeypatch, tmp_path):
    """A poll that waited until the next heartbeat is followed by the heartbeat, not by a second poll
    (the loop once compared the clock read before the poll with the deadline, found it early, and polled
    again at once: two polls per wake)."""
    from quiver.broker import broker as broker_module
    from quiver.common.config import BrokerSettings

    polls = 0

    class CountingPoller(zmq.Poller):
        def poll(self, timeout=None):  # type: ignore[no-untyped-def]
            nonlocal polls
            polls += 1
            return super().poll(timeout)

    monkeypatch.setattr(broker_module.zmq, "Poller", CountingPoller)
    idle = broker_module.Broker(BrokerSettings(frontend_endpoint=f"ipc://{tmp_path}/f", worker_endpoint=f"ipc://{tmp_path}/w",
                                               heartbeat_interval_s=0.01), ctx=zmq.Context())
    beats = 0
    heartbeat_workers = idle._heartbeat_workers

    def counted(now: float) -> None:
        nonlocal beats
        beats += 1
        if beats == 50:
            idle.stop()
        heartbeat_workers(now)

    idle._heartbeat_workers = counted  # type: ignore[method-assign]
    idle.run()
    assert beats == 50 and polls <= 1.2 * beats, f"{polls} polls for {beats} heartbeats"
