"""Stand-in workers and frontends that speak Quiver's ZeroMQ protocol and do no work, for measuring the
broker (and the frontend) alone.

A stand-in worker answers every CHUNK at once with a RESULT of the right shape (zeros); a stand-in
frontend keeps a window of small CHUNKs in flight and checks every answer. Both note, per chunk id,
when each message left and arrived on time.monotonic_ns(), which on Linux is one clock for every
process of the host, so the two sides' notes give the time of each hop through the broker.

Every message is built from quiver.common.protocol's classes; READY is built in one place,
`stand_in_ready`, so a change to READY's fields is one edit here.
"""

from __future__ import annotations

import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from quiver.common.protocol import (
    PROTOCOL_VERSION, TASK_EMBED, Chunk, Disconnect, Error, Heartbeat, Message, ProtocolError, Ready, Reconnect,
    Result, decode, split_identity,
)
from quiver.common.security import CurveClient, cluster_secret
from quiver.common.transport import make_socket, send

STAND_IN_CAPACITY_TOKENS = 1 << 24  # never the limit: the broker's routing is what is measured


def stand_in_ready(name: str, dim: int, fingerprint: str = "") -> Ready:
    """READY of a stand-in worker of output width `dim` that takes any amount of work at once."""
    return Ready(version=PROTOCOL_VERSION, name=name, model="stand-in", device="none",
                 capacity_tokens=STAND_IN_CAPACITY_TOKENS, output_dim=dim, fingerprint=fingerprint,
                 secret=cluster_secret(),
                 tasks=[TASK_EMBED], pid=os.getpid())


def stand_in_result(chunk: Chunk, worker: str, dim: int) -> Result:
    """The immediate answer to `chunk`: num_seqs rows of zeros of width `dim`."""
    return Result(chunk_id=chunk.chunk_id, num_seqs=chunk.num_seqs, dim=dim, worker=worker,
                  values=np.zeros((chunk.num_seqs, dim), dtype=np.float32))


def small_chunk(seqs: int, tokens_per_seq: int, rng: np.random.Generator, timeout_s: float = 60.0) -> Chunk:
    """A CHUNK of `seqs` random token-id sequences of `tokens_per_seq` each, under a random id."""
    return Chunk(chunk_id=secrets.token_hex(16), task=TASK_EMBED, num_seqs=seqs, num_tokens=seqs * tokens_per_seq,
                 normalize=True, timeout_s=timeout_s,
                 input_ids=rng.integers(1000, 30000, size=seqs * tokens_per_seq, dtype=np.int32),
                 seq_lens=np.full(seqs, tokens_per_seq, dtype=np.int32))


def _receive(sock: zmq.Socket, routed: bool) -> tuple[bytes | None, Message | None]:
    """One message from `sock` (None when it broke the protocol: a stand-in only counts those)."""
    frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
    identity = None
    if routed:
        identity, frames = split_identity(frames)
    try:
        return identity, decode(frames)
    except ProtocolError:
        return identity, None


def serve_stand_in_workers(endpoint: str, names: list[str], dim: int, heartbeat_s: float, stop: Any,
                           report: Any, direct_endpoint: str = "", curve: CurveClient | None = None,
                           fingerprint: str = "") -> None:
    """Process body: one DEALER per name, each registered with the broker at `endpoint`, answering every
    CHUNK at once (over CurveZMQ with `curve`), as workers of the model `fingerprint` names (the one a real
    frontend in front of them expects); with `direct_endpoint`, also a ROUTER there that frontends
    reach with no broker between.
    When `stop` is set, put {"timings": {chunk_id: (received_ns, answered_ns)}, "chunks_by_worker",
    "bad_messages"} on `report`."""
    ctx = zmq.Context()
    sockets: dict[zmq.Socket, str] = {}
    poller = zmq.Poller()
    for name in names:
        sock = make_socket(ctx, zmq.DEALER, identity=f"{name}-{os.getpid()}".encode())
        if curve is not None:
            curve.apply(sock)
        sock.connect(endpoint)
        send(sock, stand_in_ready(name, dim, fingerprint))
        sockets[sock] = name
        poller.register(sock, zmq.POLLIN)
    direct = None
    if direct_endpoint:
        direct = make_socket(ctx, zmq.ROUTER)
        direct.bind(direct_endpoint)
        poller.register(direct, zmq.POLLIN)
    timings: dict[str, tuple[int, int]] = {}
    counts = dict.fromkeys(names, 0)
    bad = 0
    next_heartbeat = time.monotonic() + heartbeat_s
    while not stop.is_set():
        for sock, _ in poller.poll(100):
            routed = sock is direct
            name = "direct" if routed else sockets[sock]
            while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                identity, message = _receive(sock, routed)
                received = time.monotonic_ns()
                if isinstance(message, Chunk):
                    result = stand_in_result(message, name, dim)
                    timings[message.chunk_id] = (received, time.monotonic_ns())
                    send(sock, result, identity)
                    counts[name] = counts.get(name, 0) + 1
                elif isinstance(message, Reconnect):
                    send(sock, stand_in_ready(name, dim, fingerprint))
                elif not isinstance(message, (Heartbeat, Disconnect)):
                    bad += 1
        if time.monotonic() >= next_heartbeat:
            for sock in sockets:
                send(sock, Heartbeat())
            next_heartbeat = time.monotonic() + heartbeat_s
    for sock in sockets:
        send(sock, Disconnect(reason="stand-in stopping"))
    report.put({"timings": timings, "chunks_by_worker": counts, "bad_messages": bad})
    ctx.destroy(linger=0)


@dataclass
class FrontendRun:
    """What one stand-in frontend saw: per chunk id, (sent_ns, answered_ns); answers that were wrong."""

    timings: dict[str, tuple[int, int]] = field(default_factory=dict)
    errors: int = 0
    wrong_answers: int = 0
    unanswered: int = 0


def wait_for_workers(sock: zmq.Socket, count: int, timeout_s: float) -> None:
    """Ask the broker (HEARTBEAT) until it says `count` workers are live; raise TimeoutError if not."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        send(sock, Heartbeat())
        if sock.poll(200):
            message = decode(sock.recv_multipart())
            if isinstance(message, Heartbeat) and message.live_workers >= count:
                return
    raise TimeoutError(f"the broker did not report {count} live workers within {timeout_s} s")


def drive_stand_in_frontend(endpoint: str, index: int, workers: int, window: int, seconds: float, seqs: int,
                            tokens_per_seq: int, dim: int, ready: Any, go: Any, report: Any,
                            curve: CurveClient | None = None) -> None:
    """Process body: connect to `endpoint` (a broker, or a stand-in worker's direct ROUTER when workers is
    0), say `ready`, wait for `go`, then keep `window` chunks in flight for `seconds`, wait for the last
    answers and put a FrontendRun on `report`. An answer counts as wrong unless it is a RESULT for a
    chunk this frontend sent and still waits for, of num_seqs rows of width `dim`."""
    ctx = zmq.Context()
    sock = make_socket(ctx, zmq.DEALER, identity=f"bench-frontend-{index}-{os.getpid()}".encode())
    if curve is not None:
        curve.apply(sock)
    sock.connect(endpoint)
    rng = np.random.default_rng(index)
    if workers:
        wait_for_workers(sock, workers, 60.0)
    run = FrontendRun()
    pool = [small_chunk(seqs, tokens_per_seq, rng) for _ in range(64)]
    _exchange(sock, pool[0], dim, run)  # first contact (and, direct, the connection itself) before timing
    run.timings.clear()
    ready.put(index)
    go.wait()
    sent: dict[str, int] = {}
    stop_sending = time.monotonic() + seconds
    give_up = stop_sending + 30.0
    turn = 0
    while time.monotonic() < give_up:
        sending = time.monotonic() < stop_sending
        while sending and len(sent) < window:
            chunk = pool[turn % len(pool)]
            turn += 1
            chunk.chunk_id = secrets.token_hex(16)
            sent[chunk.chunk_id] = time.monotonic_ns()
            send(sock, chunk)
        if not sent and not sending:
            break
        if sock.poll(100):
            while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                _, message = _receive(sock, routed=False)
                _take_answer(message, sent, seqs, dim, run)
    run.unanswered = len(sent)
    report.put(run)
    ctx.destroy(linger=0)


def _exchange(sock: zmq.Socket, chunk: Chunk, dim: int, run: FrontendRun) -> None:
    chunk.chunk_id = secrets.token_hex(16)
    sent = {chunk.chunk_id: time.monotonic_ns()}
    send(sock, chunk)
    while sent:  # the broker's answers to the heartbeats of wait_for_workers may come first
        if not sock.poll(60_000):
            raise TimeoutError("no answer to the first chunk within 60 s")
        _take_answer(decode(sock.recv_multipart()), sent, chunk.num_seqs, dim, run)
        if run.errors or run.wrong_answers:
            raise RuntimeError("the first chunk was not answered with its result")


def _take_answer(message: Message | None, sent: dict[str, int], seqs: int, dim: int, run: FrontendRun) -> None:
    answered = time.monotonic_ns()
    if isinstance(message, Heartbeat):
        return
    if isinstance(message, Error):
        run.errors += 1
        sent.pop(message.chunk_id, None)
        return
    if not isinstance(message, Result) or message.chunk_id not in sent or message.values.shape != (seqs, dim):
        run.wrong_answers += 1
        return
    run.timings[message.chunk_id] = (sent.pop(message.chunk_id), answered)
