"""Stand-in peers cheap enough to saturate the broker on one core, and the floor it is measured against.

`stand_in_peers` builds and decodes every message with the protocol's classes, which costs its peers
more CPU per chunk than the broker spends: on a host of few cores they, not the broker, set the rate.
These peers send and answer pre-encoded frames instead: a CHUNK's and a RESULT's frames are encoded
once with the protocol's classes, under a chunk id of fixed length, and each chunk sent or answered
differs from them only in the id's bytes. Each answer is still checked (a RESULT, for a chunk this
frontend sent and still waits for, with a values frame of the expected size).

`forward_floor` is the least a router of this protocol does per chunk on the same sockets: receive a
CHUNK, read its header, note the frontend under its id, send it on to a worker in turn; receive the
RESULT, read its header, send it back. What the broker routes per core, over what this floor routes
on the same core in the same run, is the broker's cost beyond the ZeroMQ calls it cannot avoid.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import zmq

from quiver.bench.stand_in_peers import small_chunk, stand_in_ready, stand_in_result
from quiver.common.protocol import Heartbeat, MsgType
from quiver.common.security import CurveClient
from quiver.common.transport import make_socket, recv_frames, send, send_frames

ID_CHARS = 32  # as the frontend's chunk ids: 128 bits in hex
_CHUNK, _RESULT, _READY = (bytes([t]) for t in (MsgType.CHUNK, MsgType.RESULT, MsgType.READY))


@dataclass(frozen=True)
class Frames:
    """A message's frames, encoded once, and where its header holds the chunk id."""

    frames: list[bytes]
    id_at: int

    def header_with(self, chunk_id: bytes) -> bytes:
        header = self.frames[1]
        return header[:self.id_at] + chunk_id + header[self.id_at + ID_CHARS:]

    def id_of(self, header: bytes) -> bytes | None:
        """The chunk id of a header laid out as this one, else None."""
        if len(header) != len(self.frames[1]) or header[:self.id_at] != self.frames[1][:self.id_at]:
            return None
        return header[self.id_at:self.id_at + ID_CHARS]


def templates(seqs: int, tokens_per_seq: int, dim: int, worker: str = "stand-in") -> tuple[Frames, Frames]:
    """(CHUNK, RESULT) frames of `seqs` sequences of `tokens_per_seq` tokens and a dense answer of width `dim`."""
    placeholder = "0" * ID_CHARS
    chunk = small_chunk(seqs, tokens_per_seq, np.random.default_rng(0))
    chunk.chunk_id = placeholder
    result = stand_in_result(chunk, worker, dim)
    out = []
    for message in (chunk, result):
        frames = [bytes(frame) for frame in message.encode()]
        out.append(Frames(frames, frames[1].index(placeholder.encode())))
    return out[0], out[1]


def _pin(cpus: set[int] | None) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)


def serve_saturating_workers(endpoint: str, names: list[str], seqs: int, tokens_per_seq: int, dim: int,
                             stop: Any, report: Any, cpus: set[int] | None = None,
                             curve: CurveClient | None = None) -> None:
    """Process body: one DEALER per name, registered at `endpoint` with a real READY and heartbeating each
    second, answering every CHUNK at once with the RESULT template under its id. Puts the number of
    chunks answered on `report` when `stop` is set."""
    _pin(cpus)
    chunk_frames, result_frames = templates(seqs, tokens_per_seq, dim)
    ctx = zmq.Context()
    poller = zmq.Poller()
    sockets = []
    for name in names:
        sock = make_socket(ctx, zmq.DEALER, identity=f"{name}-{os.getpid()}".encode())
        if curve is not None:
            curve.apply(sock)
        sock.connect(endpoint)
        send(sock, stand_in_ready(name, dim))
        sockets.append(sock)
        poller.register(sock, zmq.POLLIN)
    result_type, values = result_frames.frames[0], result_frames.frames[2]
    heartbeat = Heartbeat().encode()
    answered, next_beat = 0, time.monotonic() + 1.0
    while not stop.is_set():
        for sock, _ in poller.poll(100):
            while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                frames = sock.recv_multipart()
                if frames[0] == _CHUNK:
                    # The broker forwards a chunk's header as sent unless it had to rewrite it.
                    chunk_id = chunk_frames.id_of(frames[1]) or msgpack.unpackb(frames[1])["chunk_id"].encode()
                    sock.send_multipart([result_type, result_frames.header_with(chunk_id), values])
                    answered += 1
                elif frames[0] == bytes([MsgType.RECONNECT]):
                    send(sock, stand_in_ready(names[sockets.index(sock)], dim))
        if time.monotonic() >= next_beat:
            for sock in sockets:
                sock.send_multipart(heartbeat)
            next_beat = time.monotonic() + 1.0
    report.put(answered)
    ctx.destroy(linger=0)


@dataclass
class SaturatingRun:
    """What one saturating frontend saw: round trips (ns) of the chunks answered, and the faults."""

    round_trips_ns: list[int]
    wrong_answers: int
    unanswered: int


def drive_saturating_frontend(endpoint: str, index: int, window: int, seconds: float, seqs: int,
                              tokens_per_seq: int, dim: int, ready: Any, go: Any, report: Any,
                              cpus: set[int] | None = None, curve: CurveClient | None = None,
                              rate_per_s: float = 0.0) -> None:
    """Process body: keep `window` chunks in flight for `seconds` after `go` (one first, untimed, to see
    the route is up), then wait for the last answers and put a SaturatingRun on `report`. With
    `rate_per_s`, send at that pace instead (open loop, `window` at most in flight), each round trip
    counted from when its chunk was due, so a router that falls behind pays for the wait too."""
    _pin(cpus)
    chunk_frames, result_frames = templates(seqs, tokens_per_seq, dim)
    ctx = zmq.Context()
    sock = make_socket(ctx, zmq.DEALER, identity=f"saturating-frontend-{index}-{os.getpid()}".encode())
    if curve is not None:
        curve.apply(sock)
    sock.connect(endpoint)
    chunk_type, ids, lens = chunk_frames.frames[0], chunk_frames.frames[2], chunk_frames.frames[3]
    values_bytes = len(result_frames.frames[2])
    serial = index << 48
    sent: dict[bytes, int] = {}
    run = SaturatingRun([], 0, 0)

    def send_one(due_ns: int = 0) -> None:
        nonlocal serial
        serial += 1
        chunk_id = b"%032x" % serial
        sent[chunk_id] = due_ns or time.monotonic_ns()
        sock.send_multipart([chunk_type, chunk_frames.header_with(chunk_id), ids, lens])

    def take_answers() -> None:
        while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            frames = sock.recv_multipart()
            if frames[0] != _RESULT:
                if frames[0] != bytes([MsgType.HEARTBEAT]):
                    run.wrong_answers += 1
                continue
            chunk_id = result_frames.id_of(frames[1])
            sent_ns = sent.pop(chunk_id, None) if chunk_id is not None else None
            if sent_ns is None or len(frames) != 3 or len(frames[2]) != values_bytes:
                run.wrong_answers += 1
                continue
            run.round_trips_ns.append(time.monotonic_ns() - sent_ns)

    # First contact: a chunk every 200 ms until one is answered (the floor drops chunks that come before
    # a worker; the broker queues them), then the stragglers' answers are let in and forgotten.
    first_by = time.monotonic() + 60.0
    while not run.round_trips_ns:
        send_one()
        if sock.poll(200):
            take_answers()
        if time.monotonic() > first_by:
            raise TimeoutError("no answer to a first chunk within 60 s")
    settle_by = time.monotonic() + 0.5
    while time.monotonic() < settle_by:
        if sock.poll(50):
            take_answers()
    sent.clear()
    run.round_trips_ns.clear()
    run.wrong_answers = 0
    ready.put(index)
    go.wait()
    stop_sending = time.monotonic() + seconds
    give_up = stop_sending + 30.0
    if rate_per_s > 0:
        _paced(send_one, take_answers, sent, window, int(1e9 / rate_per_s), int(stop_sending * 1e9), give_up)
        run.unanswered = len(sent)
        report.put(run)
        ctx.destroy(linger=0)
        return
    while True:
        sending = time.monotonic() < stop_sending
        while sending and len(sent) < window:
            send_one()
        if (not sent and not sending) or time.monotonic() > give_up:
            break
        if sock.poll(100):
            take_answers()
    run.unanswered = len(sent)
    report.put(run)
    ctx.destroy(linger=0)


def _paced(send_one: Any, take_answers: Any, sent: dict[bytes, int], window: int, interval_ns: int,
           stop_ns: int, give_up: float) -> None:
    """Send a chunk every `interval_ns` until `stop_ns` (spinning between, never sleeping), reading answers
    as they come; then wait for the last ones."""
    due = time.monotonic_ns()
    while True:
        now = time.monotonic_ns()
        while due <= now and due < stop_ns and len(sent) < window:
            send_one(due)
            due += interval_ns
        if due < stop_ns and len(sent) >= window:
            due = now  # the router holds the whole window: the chunks it kept from being sent are not owed
        if (due >= stop_ns and not sent) or time.monotonic() > give_up:
            return
        take_answers()


def forward_floor(frontend_endpoint: str, worker_endpoint: str, stop: Any, cpus: set[int] | None = None) -> None:
    """Process body: route CHUNKs to the registered workers in turn and RESULTs back, with nothing else
    (no checks, no queue, no retries, no metrics), until `stop` is set."""
    _pin(cpus)
    ctx = zmq.Context()
    frontends, workers = make_socket(ctx, zmq.ROUTER), make_socket(ctx, zmq.ROUTER)
    frontends.bind(frontend_endpoint)
    workers.bind(worker_endpoint)
    poller = zmq.Poller()
    poller.register(workers, zmq.POLLIN)
    poller.register(frontends, zmq.POLLIN)
    registered: list[bytes] = []
    owners: dict[str, bytes] = {}
    turn = 0
    while not stop.is_set():
        events = poller.poll(100)
        while events:  # the broker's own calls: one message from each readable socket, then poll again
            for sock, _ in events:
                frames = recv_frames(sock)
                kind = frames[1].bytes
                if sock is frontends and kind == _CHUNK and registered:
                    owners[msgpack.unpackb(frames[2].bytes)["chunk_id"]] = frames[0].bytes
                    turn = (turn + 1) % len(registered)
                    send_frames(workers, frames[1:], registered[turn])
                elif sock is workers and kind == _RESULT:
                    owner = owners.pop(msgpack.unpackb(frames[2].bytes)["chunk_id"], None)
                    if owner is not None:
                        send_frames(frontends, frames[1:], owner)
                elif sock is workers and kind == _READY:
                    registered.append(frames[0].bytes)
            events = poller.poll(0)
    ctx.destroy(linger=0)
