"""Forged and malformed results never reach a frontend; rogue workers never register.

Each test starts a real broker process and talks to it over ZeroMQ with plain pyzmq sockets: an
honest frontend, an honest worker, and impostors that speak the same protocol."""

from __future__ import annotations

import re

import numpy as np
import pytest
import zmq

from quiver.common.protocol import Chunk, Disconnect, Error, Result
from quiver.frontend.broker_client import BrokerClient
from tests.security.wire_peers import SECRET, Peer, make_chunk, make_result, refused, start_broker


@pytest.fixture
def broker():
    cluster = start_broker()
    ctx = zmq.Context()
    yield cluster, ctx
    ctx.destroy(linger=0)
    cluster.stop()


def one_worker(cluster, ctx) -> tuple[Peer, Peer]:
    front = Peer(ctx, cluster.frontend_endpoint)
    worker = Peer(ctx, cluster.worker_endpoint)
    worker.register("honest")
    front.wait_workers(1)
    return front, worker


def test_a_result_from_a_peer_that_never_registered_is_dropped(broker):
    cluster, ctx = broker
    front, worker = one_worker(cluster, ctx)
    front.send(make_chunk("c1"))
    given = worker.recv()
    assert isinstance(given, Chunk) and given.chunk_id == "c1"
    forger = Peer(ctx, cluster.worker_endpoint)
    forger.send(make_result(given, fill=-7.0))
    assert front.recv(0.7) is None
    assert refused(cluster, "RESULT", "unregistered") == 1
    worker.send(make_result(given, fill=1.0))
    answer = front.recv()
    assert isinstance(answer, Result) and answer.chunk_id == "c1"
    np.testing.assert_array_equal(answer.values, np.ones((2, 4), dtype=np.float32))


def test_a_registered_worker_cannot_answer_a_chunk_given_to_another(broker):
    cluster, ctx = broker
    front, worker = one_worker(cluster, ctx)
    front.send(make_chunk("c1"))
    given = worker.recv()
    other = Peer(ctx, cluster.worker_endpoint)
    other.register("other")
    front.wait_workers(2)
    other.send(make_result(given, fill=-7.0))
    other.send(Error(chunk_id="c1", code="internal", message="forged"))
    assert front.recv(0.7) is None
    assert refused(cluster, "RESULT", "not_assigned") == 1
    assert refused(cluster, "ERROR", "not_assigned") == 1
    worker.send(make_result(given))
    assert isinstance(front.recv(), Result)


@pytest.mark.parametrize("shape,reason", [
    (dict(rows=1), "rows"),  # one row for two inputs
    (dict(rows=3), "rows"),
    (dict(dim=7), "dim"),  # not the width the worker declared in READY
    (dict(dtype="float16"), "dtype"),
])
def test_a_result_of_the_wrong_shape_is_dropped_even_from_the_assigned_worker(broker, shape, reason):
    cluster, ctx = broker
    front, worker = one_worker(cluster, ctx)
    front.send(make_chunk("c1"))
    given = worker.recv()
    worker.send(make_result(given, **shape))
    assert front.recv(0.7) is None
    assert refused(cluster, "RESULT", reason) == 1
    worker.send(make_result(given))  # the right answer is still taken
    answer = front.recv()
    assert isinstance(answer, Result) and answer.values.shape == (2, 4)


def test_a_values_frame_of_another_length_than_its_header_says_is_dropped(broker):
    cluster, ctx = broker
    front, worker = one_worker(cluster, ctx)
    front.send(make_chunk("c1"))
    given = worker.recv()
    frames = make_result(given).encode()
    worker.sock.send_multipart([*frames[:2], bytes(frames[2])[:-4]])
    assert front.recv(0.7) is None
    worker.send(make_result(given))
    assert isinstance(front.recv(), Result)
    assert cluster.broker.alive()


def test_a_ready_without_the_cluster_secret_is_refused_and_never_counts_as_live(broker):
    cluster, ctx = broker
    front = Peer(ctx, cluster.frontend_endpoint)
    for secret in ("", "guess", SECRET + "x"):
        rogue = Peer(ctx, cluster.worker_endpoint)
        rogue.register("rogue", secret=secret)
        refusal = rogue.recv()
        assert isinstance(refusal, Disconnect) and "secret" in refusal.reason
    assert front.live_workers() == 0
    front.send(make_chunk("c1"))
    assert rogue.recv(0.5) is None  # no chunk ever reaches a refused worker
    assert refused(cluster, "READY", "secret") == 3


def test_a_broker_without_a_secret_says_anyone_may_register():
    cluster = start_broker(secret="")
    try:
        ctx = zmq.Context()
        Peer(ctx, cluster.frontend_endpoint).live_workers()  # the broker is up and has logged
        ctx.destroy(linger=0)
    finally:
        cluster.stop()
    assert "any process" in cluster.broker.log() and "may register as a worker" in cluster.broker.log()


def test_chunk_ids_are_unguessable():
    ids = {BrokerClient.new_chunk_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(re.fullmatch(r"[0-9a-f]{32}", chunk_id) for chunk_id in ids)  # 128 random bits each


def test_a_result_is_forwarded_as_the_worker_sent_it(broker):
    """The broker routes on the header and passes the frames on: the frontend receives the worker's
    own header bytes (here with the fields in an unusual order) and values bytes."""
    import msgpack

    cluster, ctx = broker
    front, worker = one_worker(cluster, ctx)
    front.send(make_chunk("c1"))
    given = worker.recv()
    frames = [bytes(f) for f in make_result(given, fill=0.5).encode()]
    header = msgpack.unpackb(frames[1])
    frames[1] = msgpack.packb(dict(reversed(list(header.items()))))
    worker.sock.send_multipart(frames)
    assert front.sock.poll(5000)
    received = front.sock.recv_multipart()
    while received[0] != frames[0]:  # past heartbeats
        assert front.sock.poll(5000)
        received = front.sock.recv_multipart()
    assert received == frames
