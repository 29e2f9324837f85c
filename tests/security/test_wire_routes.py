"""A frontend's route and chunks are its own. Only the frontend that sent a
chunk can cancel it; a peer presenting a connected frontend's identity does not take its route; the
frontend's identity is random, and it rebuilds its socket (new identity) after a silent broker."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import numpy as np
import pytest
import zmq

from quiver.common.protocol import Cancel, Chunk, Heartbeat, Reconnect, Result
from quiver.frontend.broker_client import BrokerClient
from tests.security.wire_peers import INTERVAL, Peer, make_chunk, make_result, refused, start_broker


@pytest.fixture
def broker():
    cluster = start_broker()
    ctx = zmq.Context()
    yield cluster, ctx
    ctx.destroy(linger=0)
    cluster.stop()


def test_only_the_chunks_frontend_can_cancel_it(broker):
    cluster, ctx = broker
    owner = Peer(ctx, cluster.frontend_endpoint)
    other = Peer(ctx, cluster.frontend_endpoint)
    worker = Peer(ctx, cluster.worker_endpoint)
    worker.register("w")
    owner.wait_workers(1)
    owner.send(make_chunk("c1"))
    given = worker.recv()
    other.send(Cancel(chunk_id="c1"))
    assert worker.recv(0.5) is None  # the worker is not told to drop it
    assert refused(cluster, "CANCEL", "not_owner") == 1
    worker.send(make_result(given))
    answer = owner.recv()
    assert isinstance(answer, Result) and answer.chunk_id == "c1"
    owner.send(make_chunk("c2"))
    worker.recv()
    owner.send(Cancel(chunk_id="c2"))  # its owner may
    cancel = worker.recv()
    assert isinstance(cancel, Cancel) and cancel.chunk_id == "c2"


def test_a_peer_with_a_connected_frontends_identity_does_not_get_its_results(broker):
    cluster, ctx = broker
    identity = os.urandom(16).hex().encode()
    owner = Peer(ctx, cluster.frontend_endpoint, identity=identity)
    worker = Peer(ctx, cluster.worker_endpoint)
    worker.register("w")
    owner.wait_workers(1)
    thief = Peer(ctx, cluster.frontend_endpoint, identity=identity)
    time.sleep(0.3)  # its connection attempt has reached the broker
    owner.send(make_chunk("c1"))
    given = worker.recv()
    worker.send(make_result(given))
    answer = owner.recv()
    assert isinstance(answer, Result) and answer.chunk_id == "c1"
    assert thief.recv(0.5, skip_heartbeats=False) is None


def test_a_frontend_identity_is_random_and_is_renewed_after_a_silent_broker(broker):
    cluster, ctx = broker
    worker = Peer(ctx, cluster.worker_endpoint)
    worker.register("w")

    async def scenario() -> None:
        client = BrokerClient(cluster.frontend_endpoint, INTERVAL, 3)
        await client.start()
        assert await client.wait_for_broker(10)
        first = client.sock.getsockopt(zmq.ROUTING_ID)
        assert len(first) == 32 and not first.startswith(b"frontend")
        os.kill(cluster.broker.popen.pid, signal.SIGSTOP)  # the broker goes silent, its route stays
        try:
            task = asyncio.ensure_future(client.submit(make_chunk(BrokerClient.new_chunk_id())))
            await asyncio.sleep(5 * INTERVAL)  # past the liveness window
        finally:
            os.kill(cluster.broker.popen.pid, signal.SIGCONT)
        await asyncio.sleep(0.5)
        assert client.rebuilds >= 1 and client.sock.getsockopt(zmq.ROUTING_ID) != first
        # The chunk sent before the silence is sent again from the new socket and answered there. The
        # worker answers every copy it is given: which copy's answer reaches the client is up to timing.
        end = time.monotonic() + 20
        while not task.done() and time.monotonic() < end:
            message = await asyncio.to_thread(worker.recv, 0.3)
            if isinstance(message, Reconnect):  # the broker thought it dead while it was stopped
                worker.register("w")
            elif isinstance(message, Chunk):
                worker.send(make_result(message, fill=2.0))
            else:
                worker.send(Heartbeat())
        result = await asyncio.wait_for(task, 1)
        np.testing.assert_array_equal(result.values, np.full((2, 4), 2.0, dtype=np.float32))
        await client.close()

    asyncio.run(scenario())
