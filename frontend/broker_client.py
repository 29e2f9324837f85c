"""The frontend's link to the broker: one asyncio DEALER socket per frontend process.

`submit` sends a chunk and awaits its RESULT or ERROR. A receive task resolves the waiting futures;
a heartbeat task pings the broker each interval, and the broker's replies say how many workers are
live, which is what /health reports. Every chunk still waiting is sent again (chunks are idempotent
and the broker drops duplicates by chunk id) when the broker's replies carry a new instance id (it
restarted, however quickly) or when it answers again after a silence longer than the liveness
window. After such a silence the socket itself is rebuilt, under a new random identity.

Chunk ids and the socket's identity are random (128 bits): another peer of the broker can neither
guess a chunk id to cancel it nor connect under this frontend's identity to take its results.

The socket is a plain (blocking-API) ZeroMQ socket driven by the event loop: a reader callback on its
file descriptor receives everything waiting and resolves the futures directly, and sends never block
(NOBLOCK; a full queue fails the chunk as overloaded). pyzmq's asyncio layer would instead create a
future per receive and per send and wake a task for each (about 15 % of the frontend's CPU per
request in a batch-1 profile). ZeroMQ's descriptor is edge-triggered: it is signalled when the socket's
events change, and a send may consume that signal, so after each send the socket's EVENTS are read and
a receive scheduled if a message is waiting.

With `busy_poll_us`, the loop is kept from sleeping while chunks wait and for that long after the last
result (frontend/keep_awake.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from dataclasses import dataclass
from typing import cast

import zmq

from quiver.common.protocol import (
    Cancel, Chunk, Disconnect, Error, Heartbeat, Message, ProtocolError, Result, decode,
)
from quiver.common.security import CurveClient
from quiver.common.transport import make_socket, recv_frames, send_frames
from quiver.common.wakeups import SpinCore
from quiver.frontend import metrics
from quiver.frontend.keep_awake import KeepAwake

log = logging.getLogger("quiver.frontend.broker")

NOBLOCK = int(zmq.NOBLOCK)
# Plain ints: an enum's `&` costs a few microseconds on every send.
_EVENTS, _POLLIN = int(zmq.EVENTS), int(zmq.POLLIN)
# Messages received in one reader callback before the event loop gets its turn back.
MAX_MESSAGES_PER_CALLBACK = 256


class RandomIds:
    """128-bit random ids in hex, cut from os.urandom read 4 KiB at a time: one getrandom call per 256 ids
    instead of one per chunk. A forked child drops what its parent had read, so that no two processes hand
    out the same id."""

    ID_BYTES = 16
    READ_BYTES = 4096

    def __init__(self) -> None:
        self._pool = b""
        self._next = 0
        os.register_at_fork(after_in_child=self._drop)

    def _drop(self) -> None:
        self._pool, self._next = b"", 0

    def new(self) -> str:
        start = self._next
        if start + self.ID_BYTES > len(self._pool):
            self._pool, start = os.urandom(self.READ_BYTES), 0
        self._next = start + self.ID_BYTES
        return self._pool[start:self._next].hex()


CHUNK_IDS = RandomIds()


class ChunkFailed(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class _Waiting:
    chunk: Chunk
    future: asyncio.Future
    deadline: float


class BrokerClient:
    def __init__(self, endpoint: str, heartbeat_interval_s: float, liveness: int,
                 curve: CurveClient | None = None, fingerprint: str = "", model: str = "",
                 models: dict[str, str] | None = None, busy_poll_us: int = 0, busy_poll_pin: bool = False) -> None:
        self.endpoint = endpoint
        self.curve = curve
        # Named in every heartbeat: the broker serves this frontend only from workers of this model, or
        # of these models (fingerprint -> name) when it serves several.
        self.fingerprint = fingerprint
        self.model = model
        self.models = models or {}
        self.workers_by_model: dict[str, int] = {}
        self.interval = heartbeat_interval_s
        self.window = heartbeat_interval_s * liveness
        self.waiting: dict[str, _Waiting] = {}
        self.live_workers = 0
        self.last_heard = float("-inf")
        self.broker_id = ""
        self.rebuilds = 0
        self.ctx: zmq.Context | None = None
        self.sock: zmq.Socket | None = None
        self._heard = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader_fd: int | None = None
        self._receive_scheduled = False
        self._heartbeats: asyncio.Task | None = None
        self._socket_since = 0.0
        self._recheck: asyncio.Future | None = None
        self.keep_awake = KeepAwake(busy_poll_us / 1e6, busy=lambda: bool(self.waiting))
        self.busy_poll_pin = busy_poll_pin

    @property
    def broker_alive(self) -> bool:
        return time.monotonic() - self.last_heard <= self.window

    @property
    def healthy(self) -> bool:
        return self.broker_alive and self.live_workers > 0

    @staticmethod
    def new_chunk_id() -> str:
        return CHUNK_IDS.new()

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.ctx = zmq.Context()
        # Before the context's first socket: it finds libzmq's I/O threads by starting them.
        self.keep_awake.core = SpinCore(self.ctx, enabled=self.busy_poll_pin and self.keep_awake.window_s > 0)
        self._open_socket()
        self._heartbeats = asyncio.create_task(self._heartbeat_loop())

    def _open_socket(self) -> None:
        """A DEALER under a fresh random identity, connected, greeted, read by a callback of the loop."""
        assert self.ctx is not None and self._loop is not None
        # 128 random bits as hex: no leading zero byte, which ZeroMQ reserves.
        self.sock = make_socket(self.ctx, zmq.DEALER, identity=secrets.token_hex(16).encode())
        if self.curve is not None:
            self.curve.apply(self.sock)
        self.sock.connect(self.endpoint)
        self._socket_since = time.monotonic()
        self._reader_fd = int(self.sock.getsockopt(zmq.FD))
        self._loop.add_reader(self._reader_fd, self._receive)
        self._send(self._heartbeat())

    def _close_socket(self) -> None:
        if self._reader_fd is not None and self._loop is not None:
            self._loop.remove_reader(self._reader_fd)
            self._reader_fd = None
        if self.sock is not None:
            self.sock.close()

    async def _rebuild_socket(self) -> None:
        """The broker has been silent for the liveness window: perhaps another peer took our route, or the
        connection is wedged. Start over under a new identity and send again what we wait for."""
        log.warning("broker silent for %.1f s; rebuilding the socket", time.monotonic() - self.last_heard)
        self._close_socket()
        self.rebuilds += 1
        self._open_socket()
        self._resend_waiting()

    def _send(self, message: Message) -> bool:
        """Queue a message for the broker without blocking; False when ZeroMQ's queue is full."""
        assert self.sock is not None
        try:
            send_frames(self.sock, message.encode(), flags=NOBLOCK)
        except zmq.Again:
            return False
        if cast(int, self.sock.getsockopt(_EVENTS)) & _POLLIN:
            self._receive_soon()
        return True

    def _receive_soon(self) -> None:
        if not self._receive_scheduled and self._loop is not None:
            self._receive_scheduled = True
            self._loop.call_soon(self._receive)

    async def wait_for_broker(self, timeout_s: float) -> bool:
        """Wait until the broker has answered once (its reply says how many workers are live), or the
        timeout passes; a frontend that served before that would answer 503 to its first requests."""
        try:
            await asyncio.wait_for(self._heard.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass
        return self.broker_alive

    async def recheck_workers(self) -> bool:
        """Ask the broker now whether a worker is live and wait at most one heartbeat interval for its
        answer: the count from the last heartbeat may predate a worker's READY, and a request refused on
        it would be refused while a worker serves. Concurrent callers share one question."""
        if self.sock is None or not self.broker_alive:
            return False
        if self._recheck is None or self._recheck.done():
            self._recheck = asyncio.get_running_loop().create_future()
            self._send(self._heartbeat())
        try:
            await asyncio.wait_for(asyncio.shield(self._recheck), self.interval)
        except asyncio.TimeoutError:
            pass
        return self.healthy

    async def close(self) -> None:
        if self._heartbeats is not None:
            self._heartbeats.cancel()
            await asyncio.gather(self._heartbeats, return_exceptions=True)
        await self.keep_awake.stop()
        if self.sock is not None:
            self._send(Disconnect(reason="frontend stopping"))
            self._close_socket()
        for waiting in self.waiting.values():
            if not waiting.future.done():
                waiting.future.set_exception(ChunkFailed("unavailable", "the frontend is shutting down"))
        self.waiting.clear()

    async def submit(self, chunk: Chunk) -> Result:
        """Send a chunk and wait for its result; raise ChunkFailed with the broker's or worker's reason.
        Cancelled while waiting (the request's deadline, a failed sibling chunk, the client leaving), it
        tells the broker to drop the chunk, wherever it is."""
        assert self.sock is not None
        future = asyncio.get_running_loop().create_future()
        self.waiting[chunk.chunk_id] = _Waiting(chunk, future, time.monotonic() + chunk.timeout_s)
        try:
            if not self._send(chunk):
                raise ChunkFailed("overloaded", "the frontend's queue to the broker is full")
            self.keep_awake.touch()
            return await future
        except asyncio.CancelledError:
            answered = future.done() and not future.cancelled()  # cancelling the task cancels the future too
            if self.sock is not None and not answered:
                self._send(Cancel(chunk_id=chunk.chunk_id))
            raise
        finally:
            self.waiting.pop(chunk.chunk_id, None)

    def _receive(self) -> None:
        """The reader callback: handle what the socket holds, then give the loop back (and come back
        soon if more is waiting)."""
        self._receive_scheduled = False
        sock = self.sock
        if sock is None or sock.closed:
            return
        for _ in range(MAX_MESSAGES_PER_CALLBACK):
            try:
                frames = recv_frames(sock)
            except zmq.Again:
                return
            try:
                message = decode(frames)
            except ProtocolError as exc:
                metrics.BAD_MESSAGES.inc()
                log.warning("dropped a malformed message from the broker: %s", exc)
                continue
            try:
                self._on_message(message)
            except Exception:  # stopping here would leave the rest unread: the descriptor is edge-triggered
                log.exception("failed to handle a %s from the broker", type(message).__name__)
            # Nothing more waiting (the usual case): reading EVENTS says so for less than the zmq.Again
            # another receive would raise.
            if not cast(int, sock.getsockopt(_EVENTS)) & _POLLIN:
                return
        self._receive_soon()

    def _on_message(self, message: object) -> None:
        was_alive = self.broker_alive
        self.last_heard = time.monotonic()
        self._heard.set()
        restarted = False
        if isinstance(message, Heartbeat):
            self.live_workers = message.live_workers
            self.workers_by_model = message.workers_by_model
            metrics.LIVE_WORKERS.set(message.live_workers)
            if self._recheck is not None and not self._recheck.done():
                self._recheck.set_result(None)
            if message.broker_id != self.broker_id:
                restarted = bool(self.broker_id)
                if restarted:
                    log.warning("the broker restarted (instance %s, was %s)", message.broker_id, self.broker_id)
                self.broker_id = message.broker_id
        elif isinstance(message, (Result, Error)):
            self.keep_awake.touch()
            waiting = self.waiting.get(message.chunk_id)
            if waiting is not None and not waiting.future.done():
                if isinstance(message, Result):
                    waiting.future.set_result(message)
                else:
                    waiting.future.set_exception(ChunkFailed(message.code, message.message))
        if restarted or not was_alive:
            self._resend_waiting()

    def _resend_waiting(self) -> None:
        """The broker may have lost what it held: send it all again."""
        if not self.waiting or self.sock is None:
            return
        now = time.monotonic()
        log.warning("sending %d waiting chunks to the broker again", len(self.waiting))
        for waiting in self.waiting.values():
            waiting.chunk.timeout_s = max(0.0, waiting.deadline - now)
            self._send(waiting.chunk)
            metrics.CHUNKS_RESENT.inc()

    def _heartbeat(self) -> Heartbeat:
        return Heartbeat(fingerprint=self.fingerprint, model=self.model, models=self.models)

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            now = time.monotonic()
            if not self.broker_alive and now - max(self.last_heard, self._socket_since) > self.window:
                await self._rebuild_socket()
            self._send(self._heartbeat())
            if not self.broker_alive:
                self.live_workers = 0
                self.workers_by_model = {}
                metrics.LIVE_WORKERS.set(0)
