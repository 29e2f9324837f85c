"""The frontend's link to the broker: one asyncio DEALER socket per frontend process.

`submit` sends a chunk and awaits its RESULT or ERROR. A receive task resolves the waiting futures;
a heartbeat task pings the broker each interval, and the broker's replies say how many workers are
live, which is what /health reports. When the broker comes back after a silence longer than the
liveness window (a restart), every chunk still waiting is sent again: chunks are idempotent and the
broker drops duplicates by chunk id.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from dataclasses import dataclass

import zmq
import zmq.asyncio

from quiver.common.protocol import Cancel, Chunk, Disconnect, Error, Heartbeat, ProtocolError, Result, decode
from quiver.common.security import CurveClient
from quiver.common.transport import make_socket, send
from quiver.frontend import metrics

log = logging.getLogger("quiver.frontend.broker")


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
                 curve: CurveClient | None = None) -> None:
        self.endpoint = endpoint
        self.curve = curve
        self.interval = heartbeat_interval_s
        self.window = heartbeat_interval_s * liveness
        self.client_id = uuid.uuid4().hex[:12]
        self._counter = itertools.count()
        self.waiting: dict[str, _Waiting] = {}
        self.live_workers = 0
        self.queued_chunks = 0
        self.last_heard = float("-inf")
        self.ctx: zmq.asyncio.Context | None = None
        self.sock: zmq.asyncio.Socket | None = None
        self._tasks: list[asyncio.Task] = []

    @property
    def broker_alive(self) -> bool:
        return time.monotonic() - self.last_heard <= self.window

    @property
    def healthy(self) -> bool:
        return self.broker_alive and self.live_workers > 0

    def new_chunk_id(self) -> str:
        return f"{self.client_id}:{next(self._counter)}"

    async def start(self) -> None:
        self.ctx = zmq.asyncio.Context()
        self.sock = make_socket(self.ctx, zmq.DEALER, identity=f"frontend-{self.client_id}".encode())
        if self.curve is not None:
            self.curve.apply(self.sock)
        self.sock.connect(self.endpoint)
        send(self.sock, Heartbeat())
        self._tasks = [asyncio.create_task(self._receive_loop()), asyncio.create_task(self._heartbeat_loop())]

    async def wait_for_broker(self, timeout_s: float) -> bool:
        """Wait until the broker has answered once (its reply says how many workers are live), or the
        timeout passes; a frontend that served before that would answer 503 to its first requests."""
        end = time.monotonic() + timeout_s
        while not self.broker_alive and time.monotonic() < end:
            await asyncio.sleep(0.005)
        return self.broker_alive

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.sock is not None:
            send(self.sock, Disconnect(reason="frontend stopping"))
            self.sock.close()
        for waiting in self.waiting.values():
            if not waiting.future.done():
                waiting.future.set_exception(ChunkFailed("unavailable", "the frontend is shutting down"))
        self.waiting.clear()

    async def submit(self, chunk: Chunk) -> Result:
        """Send a chunk and wait for its result; raise ChunkFailed with the broker's or worker's reason."""
        assert self.sock is not None
        future = asyncio.get_running_loop().create_future()
        self.waiting[chunk.chunk_id] = _Waiting(chunk, future, time.monotonic() + chunk.timeout_s)
        try:
            send(self.sock, chunk)
            return await future
        finally:
            self.waiting.pop(chunk.chunk_id, None)

    def cancel(self, chunk_id: str) -> None:
        if self.waiting.pop(chunk_id, None) is not None and self.sock is not None:
            send(self.sock, Cancel(chunk_id=chunk_id))

    async def _receive_loop(self) -> None:
        assert self.sock is not None
        while True:
            frames = await self.sock.recv_multipart(copy=False)
            try:
                message = decode(frames)
            except ProtocolError as exc:
                metrics.BAD_MESSAGES.inc()
                log.warning("dropped a malformed message from the broker: %s", exc)
                continue
            self._on_message(message)

    def _on_message(self, message: object) -> None:
        was_alive = self.broker_alive
        self.last_heard = time.monotonic()
        if isinstance(message, Heartbeat):
            self.live_workers = message.live_workers
            self.queued_chunks = message.queued_chunks
            metrics.LIVE_WORKERS.set(message.live_workers)
        elif isinstance(message, (Result, Error)):
            waiting = self.waiting.get(message.chunk_id)
            if waiting is not None and not waiting.future.done():
                if isinstance(message, Result):
                    waiting.future.set_result(message)
                else:
                    waiting.future.set_exception(ChunkFailed(message.code, message.message))
        if not was_alive:
            self._resend_waiting()

    def _resend_waiting(self) -> None:
        """The broker is back after a silence: it may have lost what it held, so send it all again."""
        if not self.waiting or self.sock is None:
            return
        now = time.monotonic()
        log.warning("broker back after a silence; sending %d waiting chunks again", len(self.waiting))
        for waiting in self.waiting.values():
            waiting.chunk.timeout_s = max(0.0, waiting.deadline - now)
            send(self.sock, waiting.chunk)
            metrics.CHUNKS_RESENT.inc()

    async def _heartbeat_loop(self) -> None:
        assert self.sock is not None
        while True:
            await asyncio.sleep(self.interval)
            send(self.sock, Heartbeat())
            if not self.broker_alive:
                self.live_workers = 0
                metrics.LIVE_WORKERS.set(0)
