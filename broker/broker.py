"""The broker: one thread, one poll loop over two ROUTER sockets (frontends, workers).

It owns every chunk from receipt until its answer goes back to the frontend that sent it. Workers
register with READY (checked for the protocol version) and both sides heartbeat each interval; a
worker silent for the liveness window is dropped and its chunks are dispatched again, up to a number
of retries. A worker the broker does not know (after a broker restart, say) is told to RECONNECT.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import cast

import zmq

from quiver.broker import metrics
from quiver.broker.dispatch import Dispatcher, PendingChunk, QueueFull, WorkerState
from quiver.common.config import BrokerSettings
from quiver.common.protocol import (
    PROTOCOL_VERSION, Cancel, Chunk, Disconnect, Error, ErrorCode, Heartbeat, ProtocolError, Ready,
    Reconnect, Result,
)
from quiver.common.security import CurveServer, SecurityError, check_exposure
from quiver.common.transport import make_socket, recv_routed, send

log = logging.getLogger("quiver.broker")


def _has_input(sock: zmq.Socket) -> bool:
    """Whether another message is waiting on `sock` (ZMQ_EVENTS is an int option)."""
    return bool(cast(int, sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN)


class Broker:
    def __init__(self, settings: BrokerSettings, ctx: zmq.Context | None = None) -> None:
        self.settings = settings
        self.ctx = ctx or zmq.Context.instance()
        curve = CurveServer(settings.curve_secret_key, settings.curve_authorized_dir) \
            if settings.curve_secret_key else None
        endpoints = [settings.frontend_endpoint, settings.worker_endpoint]
        check_exposure(endpoints, curve, settings.allow_insecure)
        self.authenticator = curve.start(self.ctx) if curve else None
        self.frontends = make_socket(self.ctx, zmq.ROUTER)
        self.workers = make_socket(self.ctx, zmq.ROUTER)
        for sock, endpoint in ((self.frontends, endpoints[0]), (self.workers, endpoints[1])):
            if curve:
                curve.apply(sock)
            sock.bind(endpoint)
        self.dispatcher = Dispatcher(settings.max_queued_chunks)
        self.running = True
        self.next_heartbeat = 0.0
        log.info("broker listening: frontends on %s, workers on %s",
                 settings.frontend_endpoint, settings.worker_endpoint)

    # loop --------------------------------------------------------------------------------------
    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.frontends, zmq.POLLIN)
        poller.register(self.workers, zmq.POLLIN)
        interval = self.settings.heartbeat_interval_s
        spin_s = self.settings.busy_poll_us / 1e6
        last_message = 0.0
        while self.running:
            # Right after traffic, poll without sleeping for a moment: the next message of a busy
            # stream then costs no thread wake-up (tens of microseconds each on a virtual machine).
            spinning = time.monotonic() - last_message < spin_s
            timeout_ms = 0 if spinning else int(max(0.0, self.next_heartbeat - time.monotonic()) * 1000)
            events = dict(poller.poll(timeout_ms))
            now = time.monotonic()
            if events:
                last_message = now
            elif now < self.next_heartbeat:
                continue  # an empty spin: nothing to do until a message or the next heartbeat
            if self.workers in events:
                self._drain(self.workers, self._on_worker_message, "worker")
            if self.frontends in events:
                self._drain(self.frontends, self._on_frontend_message, "frontend")
            now = time.monotonic()
            if now >= self.next_heartbeat:
                self._heartbeat_workers(now)
                self._expire_queued(now)
                self.next_heartbeat = now + interval
            self._dispatch_queued()
            self._update_gauges()
            metrics.loop_tick()  # the loop went round: its timestamp, and systemd's watchdog
        self.close()

    def _drain(self, sock: zmq.Socket, handler, peer: str) -> None:
        """Handle every message waiting on `sock` (bounded, so neither side starves the other)."""
        for _ in range(1000):
            try:
                identity, message = recv_routed(sock)
            except zmq.Again:
                return
            except ProtocolError as exc:
                metrics.BAD_MESSAGES.labels(peer).inc()
                log.warning("dropped a malformed message from a %s: %s", peer, exc)
                if not _has_input(sock):
                    return
                continue
            handler(identity, message)
            if not _has_input(sock):
                return

    def stop(self, *_: object) -> None:
        self.running = False

    def close(self) -> None:
        for identity in list(self.dispatcher.workers):
            send(self.workers, Disconnect(reason="broker shutting down"), identity)
        self.frontends.close()
        self.workers.close()
        if self.authenticator is not None:
            self.authenticator.stop()

    # frontends --------------------------------------------------------------------------------
    def _on_frontend_message(self, frontend: bytes, message) -> None:
        if isinstance(message, Chunk):
            if self.dispatcher.knows(message.chunk_id):
                metrics.DUPLICATE_CHUNKS.inc()
                return
            metrics.CHUNKS_RECEIVED.inc()
            chunk = PendingChunk(message=message, frontend=frontend,
                                 deadline=time.monotonic() + message.timeout_s)
            self._submit(chunk)
        elif isinstance(message, Heartbeat):
            send(self.frontends, Heartbeat(live_workers=len(self.dispatcher.workers),
                                           queued_chunks=len(self.dispatcher.queue)), frontend)
        elif isinstance(message, Cancel):
            chunk = self.dispatcher.cancel(message.chunk_id)
            if chunk is not None and chunk.worker is not None:
                send(self.workers, message, chunk.worker)
        elif isinstance(message, Disconnect):
            log.info("a frontend left: %s", message.reason)
        else:
            metrics.BAD_MESSAGES.labels("frontend").inc()
            log.warning("a frontend sent %s, which frontends do not send", type(message).__name__)

    def _submit(self, chunk: PendingChunk) -> None:
        """Send a new chunk to a worker now, or queue it; answer 'overloaded' when the queue is full."""
        if not self.dispatcher.queue:
            worker = self.dispatcher.pick_worker(chunk)
            if worker is not None:
                self._send_to_worker(chunk, worker)
                return
        try:
            self.dispatcher.enqueue(chunk)
        except QueueFull:
            self._fail(chunk, ErrorCode.OVERLOADED,
                       f"the broker's queue holds {self.dispatcher.max_queued} chunks already")

    def _fail(self, chunk: PendingChunk, code: ErrorCode, reason: str) -> None:
        metrics.CHUNK_FAILURES.labels(code.value).inc()
        send(self.frontends, Error(chunk_id=chunk.chunk_id, code=code.value, message=reason), chunk.frontend)

    # workers ----------------------------------------------------------------------------------
    def _on_worker_message(self, identity: bytes, message) -> None:
        worker = self.dispatcher.workers.get(identity)
        if isinstance(message, Ready):
            self._register(identity, message)
            return
        if isinstance(message, (Result, Error)):
            self._on_outcome(message)
        elif isinstance(message, Disconnect):
            if worker is not None:
                log.info("worker %s left: %s", worker.name, message.reason)
                self._drop_worker(identity, "left")
            return
        elif not isinstance(message, Heartbeat):
            metrics.BAD_MESSAGES.labels("worker").inc()
            log.warning("a worker sent %s, which workers do not send", type(message).__name__)
            return
        if worker is None:
            send(self.workers, Reconnect(), identity)
            return
        worker.expiry = time.monotonic() + self.settings.liveness_window_s
        if isinstance(message, Heartbeat) and message.draining and not worker.draining:
            log.info("worker %s is draining: no new chunks go to it", worker.name)
            worker.draining = True

    def _register(self, identity: bytes, ready: Ready) -> None:
        if ready.version != PROTOCOL_VERSION:
            log.error("refused worker %s (pid %d): it speaks protocol version %d, this broker %d",
                      ready.name, ready.pid, ready.version, PROTOCOL_VERSION)
            send(self.workers, Disconnect(reason=f"protocol version {ready.version} is not "
                                                 f"{PROTOCOL_VERSION}"), identity)
            return
        worker = WorkerState(
            identity=identity, name=ready.name, device=ready.device, capacity_tokens=ready.capacity_tokens,
            max_seqs=ready.max_seqs, tasks=frozenset(ready.tasks),
            expiry=time.monotonic() + self.settings.liveness_window_s,
        )
        orphans = self.dispatcher.add_worker(worker)
        self._requeue(orphans)
        metrics.WORKER_UP.labels(worker.name).set(1)
        log.info("worker %s ready: pid %d, %s, model %s, capacity %d tokens",
                 ready.name, ready.pid, ready.device, ready.model, ready.capacity_tokens)

    def _on_outcome(self, message: Result | Error) -> None:
        chunk = self.dispatcher.complete(message.chunk_id)
        if chunk is None:
            metrics.DUPLICATE_RESULTS.inc()
            return
        if isinstance(message, Error):
            metrics.CHUNK_FAILURES.labels(message.code).inc()
        send(self.frontends, message, chunk.frontend)

    def _drop_worker(self, identity: bytes, reason: str) -> None:
        worker = self.dispatcher.workers.get(identity)
        if worker is None:
            return
        orphans = self.dispatcher.remove_worker(identity)
        metrics.DEAD_WORKERS.labels(reason).inc()
        metrics.WORKER_UP.labels(worker.name).set(0)
        metrics.INFLIGHT_CHUNKS.labels(worker.name).set(0)
        metrics.INFLIGHT_TOKENS.labels(worker.name).set(0)
        if orphans:
            log.warning("worker %s lost (%s) holding %d chunks; dispatching them again",
                        worker.name, reason, len(orphans))
        self._requeue(orphans)

    def _requeue(self, chunks: list[PendingChunk]) -> None:
        for chunk in reversed(chunks):
            chunk.attempt += 1
            if chunk.attempt > self.settings.max_retries:
                self._fail(chunk, ErrorCode.UNAVAILABLE,
                           f"the chunk's worker was lost {chunk.attempt} times; giving up")
                continue
            metrics.REQUEUES.inc()
            self.dispatcher.enqueue(chunk, front=True)

    def _send_to_worker(self, chunk: PendingChunk, worker: WorkerState) -> None:
        self.dispatcher.assign(chunk, worker)
        message = chunk.message
        message.timeout_s = max(0.0, chunk.deadline - time.monotonic())
        message.attempt = chunk.attempt
        send(self.workers, message, worker.identity)
        metrics.DISPATCHES.labels(worker.name).inc()

    def _dispatch_queued(self) -> None:
        queue = self.dispatcher.queue
        while queue:
            worker = self.dispatcher.pick_worker(queue[0])
            if worker is None:
                return
            self._send_to_worker(self.dispatcher.pop_queued(), worker)

    def _heartbeat_workers(self, now: float) -> None:
        for worker in self.dispatcher.expired_workers(now):
            log.warning("worker %s missed %d heartbeats", worker.name, self.settings.liveness)
            self._drop_worker(worker.identity, "silent")
        for identity in self.dispatcher.workers:
            send(self.workers, Heartbeat(), identity)

    def _expire_queued(self, now: float) -> None:
        for chunk in self.dispatcher.take_expired_queued(now):
            if self.dispatcher.workers:
                self._fail(chunk, ErrorCode.EXPIRED, "the request's deadline passed while it waited for a worker")
            else:
                self._fail(chunk, ErrorCode.UNAVAILABLE, "no worker is live")

    def _update_gauges(self) -> None:
        metrics.QUEUE_DEPTH.set(len(self.dispatcher.queue))
        metrics.LIVE_WORKERS.set(len(self.dispatcher.workers))
        for worker in self.dispatcher.workers.values():
            metrics.INFLIGHT_CHUNKS.labels(worker.name).set(len(worker.inflight))
            metrics.INFLIGHT_TOKENS.labels(worker.name).set(worker.outstanding_tokens)


def run_broker(settings: BrokerSettings) -> int:
    """Entry point of `quiver broker`: bind, serve until SIGINT/SIGTERM, exit 0."""
    from quiver.common import sdnotify
    from quiver.common.metrics import serve_metrics

    try:
        broker = Broker(settings)
    except zmq.ZMQError as exc:
        log.error("broker cannot bind its endpoints (%s, %s): %s",
                  settings.frontend_endpoint, settings.worker_endpoint, exc)
        return 1
    except SecurityError as exc:
        log.error("broker refuses to start: %s", exc)
        return 1
    serve_metrics(settings.metrics_port, settings.metrics_host)

    def stop(signum: int, frame: object) -> None:
        sdnotify.stopping()
        broker.stop(signum, frame)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    metrics.loop_tick.watchdog = sdnotify.Watchdog.from_environment()
    sdnotify.ready(f"frontends on {settings.frontend_endpoint}, workers on {settings.worker_endpoint}")
    broker.run()
    log.info("broker stopped")
    return 0
