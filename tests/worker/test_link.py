"""The worker's link to the broker, in both arrangements (worker/link.py), against a ROUTER socket in the
test standing where the broker would: READY on connect, chunks in, results out, heartbeats at the
interval, the drain announced, DISCONNECT on close, and a new socket with READY again after the broker's
silence. The inline link is driven the way the scheduler drives it: its inbox polled from this thread."""

from __future__ import annotations

import queue
import time
from typing import Iterator

import numpy as np
import pytest
import zmq
from prometheus_client import REGISTRY

from quiver.common.config import WorkerSettings
from quiver.common.protocol import (
    PROTOCOL_VERSION, Chunk, Disconnect, Heartbeat, Message, Ready, Result, decode, split_identity,
)
from quiver.common.transport import make_socket, send
from quiver.worker.link import IDLE_POLL_MS, InlineLink, ThreadedLink, open_link
from tests.cluster import free_port

INTERVAL = 0.05


class StandInBroker:
    """A bound ROUTER: what a worker's link sends, as (identity, message), and sends back to it."""

    def __init__(self, ctx: zmq.Context) -> None:
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.sock = make_socket(ctx, zmq.ROUTER)
        self.sock.bind(self.endpoint)
        self.delivered: list[Message] = []  # what the link handed its scheduler while recv() pumped it

    def recv(self, link: InlineLink | ThreadedLink | None, timeout: float = 3.0,
             want: type[Message] | None = None) -> tuple[bytes, Message]:
        """The next message (of type `want`, others skipped), pumping the link (unless None: closed) as its
        scheduler would."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if link is not None:
                self.delivered += pump(link, 0.005)
            if self.sock.poll(5):
                identity, frames = split_identity(self.sock.recv_multipart(copy=False))
                message = decode(frames)
                if want is None or isinstance(message, want):
                    return identity, message
        raise AssertionError(f"the link sent no {want.__name__ if want else 'message'} within {timeout} s")

    def send(self, identity: bytes, message: Message) -> None:
        send(self.sock, message, identity)


def pump(link: InlineLink | ThreadedLink, timeout: float) -> list[Message]:
    """What the scheduler's _absorb does: one blocking get, then whatever else is waiting."""
    got: list[Message] = []
    try:
        got.append(link.inbox.get(timeout=timeout))
        while True:
            got.append(link.inbox.get_nowait())
    except queue.Empty:
        return got


def ready() -> Ready:
    return Ready(version=PROTOCOL_VERSION, name="w", model="m", device="cpu", capacity_tokens=100, output_dim=4)


def chunk(chunk_id: str) -> Chunk:
    return Chunk(chunk_id=chunk_id, task="embed", num_seqs=1, num_tokens=3, normalize=True, timeout_s=5.0,
                 input_ids=np.array([1, 2, 3], dtype=np.int32), seq_lens=np.array([3], dtype=np.int32))


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


@pytest.fixture(params=["off", "on"], ids=["inline", "threaded"])
def link_and_broker(request, ctx) -> Iterator[tuple[InlineLink | ThreadedLink, StandInBroker]]:
    broker = StandInBroker(ctx)
    settings = WorkerSettings(broker=broker.endpoint, heartbeat_interval_s=INTERVAL, link_thread=request.param)
    link = open_link(ctx, settings, ready())
    assert isinstance(link, InlineLink if request.param == "off" else ThreadedLink)
    link.start(stalled_for=lambda now: 0.0)
    yield link, broker
    link.close()


def test_auto_is_inline_on_a_gpu_and_threaded_on_a_cpu(ctx):
    broker = StandInBroker(ctx)
    for device, kind in (("cuda:0", InlineLink), ("cpu", ThreadedLink)):
        link = open_link(ctx, WorkerSettings(broker=broker.endpoint, device=device), ready())
        assert isinstance(link, kind)
        link.close()


def test_registers_takes_chunks_and_sends_results(link_and_broker):
    link, broker = link_and_broker
    identity, message = broker.recv(link, want=Ready)
    assert message == ready()
    broker.send(identity, chunk("c1"))
    broker.send(identity, chunk("c2"))
    end = time.monotonic() + 3
    while len(broker.delivered) < 2 and time.monotonic() < end:
        broker.delivered += pump(link, 0.05)
    assert [m.chunk_id for m in broker.delivered if isinstance(m, Chunk)] == ["c1", "c2"]
    link.send(Result(chunk_id="c1", num_seqs=1, dim=4, worker="w", values=np.ones((1, 4), dtype=np.float32)))
    _, result = broker.recv(link, want=Result)
    assert isinstance(result, Result) and result.chunk_id == "c1"


def test_an_empty_inbox_answers_get_nowait_at_once(link_and_broker):
    """The scheduler asks the inbox for more work between steps without blocking: ten such calls on an
    empty inbox take less than one idle poll (each waited for the poll once, which held every step up)."""
    link, broker = link_and_broker
    broker.recv(link, want=Ready)
    started = time.monotonic()
    for call in (link.inbox.get_nowait, lambda: link.inbox.get(block=False)) * 5:
        with pytest.raises(queue.Empty):
            call()
    assert time.monotonic() - started < IDLE_POLL_MS / 1000


def test_heartbeats_at_the_interval_and_the_drain_is_announced(link_and_broker):
    link, broker = link_and_broker
    identity, _ = broker.recv(link, want=Ready)
    start = time.monotonic()
    for _ in range(4):
        _, beat = broker.recv(link, want=Heartbeat)
        assert isinstance(beat, Heartbeat) and not beat.draining
        broker.send(identity, Heartbeat())  # the broker answers: the link keeps its socket
    assert time.monotonic() - start < 20 * INTERVAL
    link.drain()
    _, beat = broker.recv(link, want=Heartbeat)
    assert isinstance(beat, Heartbeat) and beat.draining


def test_close_says_disconnect(ctx):
    for mode in ("off", "on"):
        broker = StandInBroker(ctx)
        link = open_link(ctx, WorkerSettings(broker=broker.endpoint, heartbeat_interval_s=INTERVAL,
                                             link_thread=mode), ready())
        link.start(stalled_for=lambda now: 0.0)
        broker.recv(link, want=Ready)
        link.close()
        _, message = broker.recv(None, want=Disconnect)
        assert isinstance(message, Disconnect) and message.reason == "worker stopping"


def counted(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


def test_a_malformed_message_from_the_broker_is_counted_and_the_next_one_still_delivered(link_and_broker):
    link, broker = link_and_broker
    identity, _ = broker.recv(link, want=Ready)
    before = counted("quiver_worker_bad_messages_total")
    broker.sock.send_multipart([identity, b"\xff", b"not msgpack"])
    broker.send(identity, Ready(version=PROTOCOL_VERSION, name="b", model="m", device="cpu", capacity_tokens=1,
                                output_dim=4))  # well formed, but not a message a broker sends
    broker.send(identity, chunk("after"))
    end = time.monotonic() + 3
    while not broker.delivered and time.monotonic() < end:
        broker.delivered += pump(link, 0.05)
    assert [m.chunk_id for m in broker.delivered if isinstance(m, Chunk)] == ["after"]
    assert counted("quiver_worker_bad_messages_total") == before + 2


def test_a_silent_broker_gets_a_new_socket_and_ready_again(link_and_broker):
    link, broker = link_and_broker
    reconnects = counted("quiver_worker_broker_reconnects_total")
    first, _ = broker.recv(link, want=Ready)
    # Never answered: after the liveness window (3 heartbeats) and the back-off (one interval) the link
    # replaces its socket and registers again; a chunk sent before that still reaches the scheduler.
    broker.send(first, chunk("before"))
    again, message = broker.recv(link, timeout=5.0, want=Ready)
    assert message == ready() and again == first  # the same secret identity, on a new connection
    assert [m.chunk_id for m in broker.delivered if isinstance(m, Chunk)] == ["before"]
    assert counted("quiver_worker_broker_reconnects_total") >= reconnects + 1


def test_a_broker_that_speaks_during_the_back_off_keeps_the_socket(ctx):
    broker = StandInBroker(ctx)
    link = InlineLink(ctx, WorkerSettings(broker=broker.endpoint, heartbeat_interval_s=INTERVAL), ready())
    identity, _ = broker.recv(link, want=Ready)
    end = time.monotonic() + 10
    while link.connection.reconnect_at is None:  # silent past the liveness window: the back-off begins
        assert time.monotonic() < end
        pump(link, 0.01)
    socket = link.connection.sock
    broker.send(identity, Heartbeat())
    end = time.monotonic() + 1
    while link.connection.reconnect_at is not None and time.monotonic() < end:
        pump(link, 0.01)
    assert link.connection.reconnect_at is None and link.connection.sock is socket
    link.close()


def test_the_inline_link_drains_a_read_without_polling_again_and_polls_on_the_next_call(ctx):
    """After a read that emptied the socket, the scheduler's drain ends without reading the socket again (a
    poll that would find nothing, on every request's path); the call after that polls as before."""
    broker = StandInBroker(ctx)
    link = InlineLink(ctx, WorkerSettings(broker=broker.endpoint, heartbeat_interval_s=INTERVAL), ready())
    try:
        identity, _ = broker.recv(link, want=Ready)
        reads = []
        read = link.connection.read
        link.connection.read = lambda: reads.append(1) or read()  # type: ignore[method-assign]
        broker.send(identity, chunk("c1"))
        broker.send(identity, chunk("c2"))
        time.sleep(0.05)  # both are in the socket before the read
        assert isinstance(link.get(timeout=1.0), Chunk) and len(reads) == 1
        assert isinstance(link.get_nowait(), Chunk)  # the second, from the same read
        with pytest.raises(queue.Empty):
            link.get_nowait()
        assert len(reads) == 1
        broker.send(identity, chunk("c3"))
        end = time.monotonic() + 3
        got = None
        while got is None and time.monotonic() < end:
            try:
                got = link.get_nowait()
            except queue.Empty:
                time.sleep(0.005)
        assert isinstance(got, Chunk) and got.chunk_id == "c3" and len(reads) >= 2
    finally:
        link.close()
