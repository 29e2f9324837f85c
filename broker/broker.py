"""The broker: one thread, one poll loop over two ROUTER sockets (frontends, workers).

It owns every chunk from receipt until its answer goes back to the frontend that sent it. Workers
register with READY (checked for the protocol version, the cluster secret and the model) and both
sides heartbeat each interval; a worker silent for the liveness window is dropped and its chunks are
dispatched again, up to a number of retries, as is a chunk a live worker holds past its hold budget.
A worker the broker does not know (after a broker restart, say) is told to RECONNECT; every heartbeat
carries this broker's random instance id, so peers notice a restart however quick.

Trust: a RESULT or ERROR is accepted only from the worker the chunk is assigned to, a RESULT only with
the rows, width and dtype the chunk and that worker's READY imply; a CANCEL only from the chunk's
frontend. Anything else is dropped, counted (quiver_broker_refused_messages_total) and logged at a
bounded rate. CHUNK and RESULT array frames are never read here: they are forwarded as received.

Copies of array data in the broker: none. Frames are received with copy=False (zmq messages owning
libzmq's buffers) and sent on with copy=False, which hands the same buffers to the outgoing message.
What is built anew is small: a CHUNK's header when its timeout or attempt changed, an ERROR (no arrays).
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from typing import Any, Callable

import zmq

from quiver.broker import metrics, wire
from quiver.broker.dispatch import Dispatcher, PendingChunk, QueueFull, WorkerState
from quiver.broker.model_guard import ModelGuard
from quiver.common.config import BrokerSettings
from quiver.common.metrics import Children
from quiver.common.protocol import (
    PROTOCOL_VERSION, Cancel, Disconnect, Error, ErrorCode, Heartbeat, Message, MsgType, ProtocolError, Ready,
    Reconnect, Routed,
)
from quiver.common.security import (
    FRONTEND_DOMAIN, WORKER_DOMAIN, check_exposure, cluster_secret, secret_matches, server_from,
)
from quiver.common.transport import make_socket, recv_frames, send, send_frames
from quiver.common.wakeups import SpinCore

log = logging.getLogger("quiver.broker")

# Messages handled in one turn of the loop before it looks at its deadlines.
MAX_MESSAGES_PER_TURN = 2000
# Messages taken from a socket in a row once a turn has seen it readable more than once: under sustained
# load a poll per message or two was a tenth of the broker's CPU (a poll is a system call; a message
# already in libzmq's pipe is taken without one).
BURST = 16
# The gauges (queue depth, chunks and tokens in flight per worker) are set at most this often after a
# change, not on every turn of the loop: with many workers that was most of the loop's per-message work.
GAUGE_INTERVAL_S = 0.05


class Broker:
    def __init__(self, settings: BrokerSettings, ctx: zmq.Context | None = None) -> None:
        self.settings = settings
        self.ctx = ctx or zmq.Context.instance()
        # Before the context's first socket: it finds libzmq's I/O threads by starting them.
        self.spin_core = SpinCore(self.ctx, enabled=settings.busy_poll_pin and settings.busy_poll_us > 0)
        curve = server_from(settings.curve_secret_key, settings.curve_frontend_keys_dir,
                            settings.curve_worker_keys_dir, settings.curve_authorized_dir)
        endpoints = [settings.frontend_endpoint, settings.worker_endpoint]
        check_exposure(endpoints, curve, settings.allow_insecure)
        self.secret = cluster_secret(settings.cluster_secret_file)
        if not self.secret:
            log.warning("no cluster secret (QUIVER_CLUSTER_SECRET or --cluster-secret-file): any process that "
                        "can reach %s may register as a worker", settings.worker_endpoint)
        self.authenticator = curve.start(self.ctx) if curve else None
        self.frontends = make_socket(self.ctx, zmq.ROUTER)
        # A worker replaces its socket after a silence and comes back under the same identity, before
        # the old connection may have been noticed as gone: let it take its route. Its identity is 128
        # random bits (worker/link.py), so no other peer can present it. Frontends take a new identity
        # on every new socket, so their ROUTER refuses a second peer presenting a connected identity.
        self.workers = make_socket(self.ctx, zmq.ROUTER, handover=True)
        for sock, endpoint, domain in ((self.frontends, endpoints[0], FRONTEND_DOMAIN),
                                       (self.workers, endpoints[1], WORKER_DOMAIN)):
            if curve:
                curve.apply(sock, domain)
            sock.bind(endpoint)
        self.instance_id = secrets.token_hex(8)
        self.models = ModelGuard()
        self.dispatcher = Dispatcher(settings.max_queued_chunks, settings.max_background_chunks)
        self.refusals = metrics.Refusals()
        # Settings read for every chunk or message, looked up once.
        self.liveness_window_s = settings.liveness_window_s
        self.chunk_hold_s, self.hold_tokens_per_s = settings.chunk_hold_s, settings.chunk_hold_tokens_per_s
        self.running = True
        self.next_heartbeat = 0.0
        self.gauges_due: float | None = 0.0  # when the gauges are next set; None: nothing changed
        self.dispatch_counters = Children(metrics.DISPATCHES)  # by worker name
        self.received_counters = Children(metrics.CHUNKS_RECEIVED)  # by model name
        log.info("broker %s listening: frontends on %s, workers on %s",
                 self.instance_id, settings.frontend_endpoint, settings.worker_endpoint)

    # loop --------------------------------------------------------------------------------------
    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.workers, zmq.POLLIN)  # results first: they free workers for waiting chunks
        poller.register(self.frontends, zmq.POLLIN)
        poll, monotonic = poller.poll, time.monotonic
        interval = self.settings.heartbeat_interval_s
        spin_s = self.settings.busy_poll_us / 1e6
        spin_core = self.spin_core
        last_message = 0.0
        while self.running:
            # Right after traffic, poll without sleeping for a moment, libzmq's I/O threads on this
            # thread's CPU (common/wakeups.py): the next message of a busy stream then wakes no thread on
            # a halted CPU (tens of microseconds to a millisecond each on a virtual machine).
            wake_at = self.next_heartbeat if self.gauges_due is None else min(self.next_heartbeat, self.gauges_due)
            now = monotonic()
            if now - last_message < spin_s:
                timeout_ms = 0
                spin_core.hold()
            else:
                spin_core.release()
                # Rounded up: rounded down, the last millisecond before each deadline was a busy loop.
                timeout_ms = max(0, math.ceil((wake_at - now) * 1000))
            events = poll(timeout_ms)
            if events:
                now = last_message = monotonic()
                self._take_waiting(events, poll)
                if self.dispatcher.queued:
                    self._dispatch_queued()
                if self.gauges_due is None:
                    self.gauges_due = now + GAUGE_INTERVAL_S
            now = monotonic()  # after the poll: the reading before it is early whenever the poll waited
            if not events and now < wake_at:
                spin_core.spin_turn()
                continue  # an empty spin: nothing to do until a message, the next heartbeat or the gauges
            if now >= self.next_heartbeat:
                self._heartbeat_workers(now)
                self._expire_queued(now)
                self._take_back_overdue(now)
                self._dispatch_queued()
                self.next_heartbeat = now + interval
            if self.gauges_due is not None and now >= self.gauges_due:
                self._update_gauges()
                self.gauges_due = None
            metrics.loop_tick()  # the loop went round: its timestamp, and systemd's watchdog
        spin_core.release()
        self.close()

    def _take_waiting(self, events: list[tuple[Any, int]], poll: Callable[[int], list[tuple[Any, int]]]) -> None:
        """Handle the waiting messages: one from each socket `events` found readable, then poll again
        without waiting; while sockets keep being readable, up to BURST from each before the next poll;
        until neither has a message or MAX_MESSAGES_PER_TURN were taken. The first round takes one per
        socket, as a receive that finds nothing costs more than a poll: a lone message pays no extra."""
        workers = self.workers
        burst, taken = 1, 0
        while taken < MAX_MESSAGES_PER_TURN:
            for sock, _event in events:
                handler, peer = ((self._on_worker_message, "worker") if sock is workers
                                 else (self._on_frontend_message, "frontend"))
                for _ in range(burst):
                    if not self._take(sock, handler, peer):
                        break
                    taken += 1
            events = poll(0)
            if not events:
                return
            burst = BURST

    def _take(self, sock: zmq.Socket, handler: Callable[[bytes, Message | Routed], None], peer: str) -> bool:
        """Receive one message from `sock` and hand it to `handler` (a malformed one is counted and
        dropped); False if nothing waited."""
        try:
            frames = recv_frames(sock)
        except zmq.Again:
            return False
        try:
            identity, message = wire.read(frames)
        except ProtocolError as exc:
            metrics.BAD_MESSAGES.labels(peer).inc()
            self.refusals.warn("message", f"malformed from a {peer}", "%s", exc)
        else:
            handler(identity, message)
        return True

    def stop(self, *_: object) -> None:
        self.running = False

    def close(self) -> None:
        for identity in list(self.dispatcher.workers):
            send(self.workers, Disconnect(reason="broker shutting down"), identity)
        self.frontends.close()
        self.workers.close()
        if self.authenticator is not None:
            self.authenticator.stop()

    def _heartbeat(self) -> Heartbeat:
        return Heartbeat(live_workers=len(self.dispatcher.workers), broker_id=self.instance_id)

    def _frontend_heartbeat(self, models: dict[str, str]) -> Heartbeat:
        """The answer to a frontend's heartbeat naming `models`: their live workers, in all and per model."""
        if not models:
            return self._heartbeat()
        counts = {fingerprint: self.dispatcher.live_workers(fingerprint) for fingerprint in models}
        return Heartbeat(live_workers=sum(counts.values()), broker_id=self.instance_id, workers_by_model=counts)

    # frontends --------------------------------------------------------------------------------
    def _on_frontend_message(self, frontend: bytes, message: Message | Routed) -> None:
        if type(message) is Routed and message.type is MsgType.CHUNK:
            self._on_chunk(frontend, message)
        elif isinstance(message, Heartbeat):
            models = message.expected_models()
            self._check_frontend_model(frontend, models)
            if self.models.is_foreign(frontend):
                beat = self._heartbeat()
                beat.live_workers = 0  # none serves its model
            else:
                beat = self._frontend_heartbeat(models)
            send(self.frontends, beat, frontend)
        elif isinstance(message, Cancel):
            self._on_cancel(frontend, message)
        elif isinstance(message, Disconnect):
            log.info("a frontend left: %s", message.reason)
        else:
            metrics.BAD_MESSAGES.labels("frontend").inc()
            self.refusals.warn("message", "wrong direction", "a frontend sent %s, which frontends do not send",
                                 type(message).__name__)

    def _check_frontend_model(self, frontend: bytes, models: dict[str, str]) -> None:
        verdict = self.models.frontend_expects(frontend, models)
        if verdict == "set":
            log.info("serving %s, as the first frontend expects", self.models.served())
            for worker in list(self.dispatcher.workers.values()):
                if not self.models.admits(worker.fingerprint):
                    self._refuse_model(worker.identity, worker.name, worker.model, worker.fingerprint)
                    self._drop_worker(worker.identity, "left")
        elif verdict == "foreign":
            self.refusals.warn("HEARTBEAT", "model", "a frontend expects %s, this broker serves %s: its chunks "
                               "are refused", ", ".join(f"{n} (fingerprint {f})" for f, n in models.items()),
                               self.models.served())

    def _refuse_model(self, identity: bytes, name: str, model: str, fingerprint: str) -> None:
        reason = self.models.refusal(model, fingerprint)
        self.refusals.refuse("READY", "model", "worker %s: %s", name, reason)
        send(self.workers, Disconnect(reason=reason), identity)

    def _on_chunk(self, frontend: bytes, message: Routed) -> None:
        if self.models.is_foreign(frontend):
            metrics.REFUSED.labels("CHUNK", "model").inc()
            self._fail(PendingChunk(message=message, frontends=[frontend], deadline=0.0), ErrorCode.UNAVAILABLE,
                       f"this broker serves {self.models.served()}, not the model this frontend expects")
            return
        header = message.header
        model = header.get("model", "")
        if model and not self.models.admits(model):
            metrics.REFUSED.labels("CHUNK", "model").inc()
            self._fail(PendingChunk(message=message, frontends=[frontend], deadline=0.0), ErrorCode.UNAVAILABLE,
                       f"no worker of this broker serves the model of fingerprint {model}; it serves "
                       f"{self.models.served()}")
            return
        known = self.dispatcher.find(header["chunk_id"])
        if known is not None:
            # A frontend sends a chunk again after rebuilding its socket (new identity). Its id is a
            # 128-bit secret shared only by that frontend, this broker and the chunk's worker, so
            # knowing it proves ownership: answer the new identity too.
            known.add_sender(frontend)
            metrics.DUPLICATE_CHUNKS.inc()
            return
        self.received_counters[self.models.models.get(model, "")].inc()
        self._submit(PendingChunk(message=message, frontends=[frontend], deadline=time.monotonic() + header["timeout_s"]))

    def _on_cancel(self, frontend: bytes, message: Cancel) -> None:
        chunk = self.dispatcher.find(message.chunk_id)
        if chunk is None:
            return
        if frontend not in chunk.frontends:
            self.refusals.refuse("CANCEL", "not_owner", "chunk %s was sent by another frontend", message.chunk_id)
            return
        self.dispatcher.cancel(message.chunk_id)
        if chunk.worker is not None:
            send(self.workers, message, chunk.worker)

    def _submit(self, chunk: PendingChunk) -> None:
        """Send a new chunk to a worker now, or queue it; answer 'overloaded' when the queue is full."""
        if not self.dispatcher.waits_ahead(chunk):
            worker = self.dispatcher.pick_worker(chunk)
            if worker is not None:
                self._send_to_worker(chunk, worker, as_received=True)
                return
        try:
            self.dispatcher.enqueue(chunk, now=time.monotonic())
        except QueueFull:
            self._fail(chunk, ErrorCode.OVERLOADED,
                       f"the broker's queue holds {self.dispatcher.max_queued} chunks already")

    def _fail(self, chunk: PendingChunk, code: ErrorCode, reason: str) -> None:
        metrics.CHUNK_FAILURES.labels(code.value).inc()
        self._answer(chunk, Error(chunk_id=chunk.chunk_id, code=code.value, message=reason).encode())

    def _answer(self, chunk: PendingChunk, frames: list[Any]) -> None:
        """Send an answer to every identity the chunk came from."""
        for frontend in chunk.frontends:
            send_frames(self.frontends, frames, frontend)

    # workers ----------------------------------------------------------------------------------
    def _on_worker_message(self, identity: bytes, message: Message | Routed) -> None:
        worker = self.dispatcher.workers.get(identity)
        if type(message) is Routed and worker is not None and message.type is MsgType.RESULT:
            self._on_outcome(worker, message)  # the common case first
        elif isinstance(message, Ready):
            self._register(identity, message)
            return
        elif isinstance(message, Disconnect):
            if worker is not None:
                log.info("worker %s left: %s", worker.name, message.reason)
                self._drop_worker(identity, "left")
            return
        elif worker is None:
            if isinstance(message, (Routed, Error)):
                self.refusals.refuse(_type_name(message), "unregistered",
                                     "from a peer that is not a registered worker")
            send(self.workers, Reconnect(), identity)
            return
        elif isinstance(message, Error):
            self._on_outcome(worker, message)
        elif isinstance(message, Heartbeat):
            if message.draining and not worker.draining:
                log.info("worker %s is draining: no new chunks go to it", worker.name)
                worker.draining = True
        else:
            metrics.BAD_MESSAGES.labels("worker").inc()
            self.refusals.warn("message", "wrong direction", "a worker sent %s, which workers do not send",
                                 _type_name(message))
            return
        worker.expiry = time.monotonic() + self.liveness_window_s

    def _register(self, identity: bytes, ready: Ready) -> None:
        if ready.version != PROTOCOL_VERSION:
            self.refusals.refuse("READY", "version", "worker %s (pid %d) speaks protocol version %d, this broker %d",
                                 ready.name, ready.pid, ready.version, PROTOCOL_VERSION)
            send(self.workers, Disconnect(reason=f"protocol version {ready.version} is not "
                                                 f"{PROTOCOL_VERSION}"), identity)
            return
        if not secret_matches(self.secret, ready.secret):
            self.refusals.refuse("READY", "secret", "worker %r (pid %d) did not give the cluster secret",
                                 ready.name, ready.pid)
            send(self.workers, Disconnect(reason="READY lacks this broker's cluster secret"), identity)
            return
        if not self.models.admits(ready.fingerprint):
            self._refuse_model(identity, ready.name, ready.model, ready.fingerprint)
            return
        worker = WorkerState(
            identity=identity, name=ready.name, device=ready.device, capacity_tokens=ready.capacity_tokens,
            tasks=frozenset(ready.tasks), expiry=time.monotonic() + self.liveness_window_s,
            output_dim=ready.output_dim, output_dtype=ready.output_dtype, model=ready.model,
            fingerprint=ready.fingerprint, token_dim=ready.token_dim,
        )
        self.dispatcher.add_worker(worker)
        metrics.WORKER_UP.labels(worker.name).set(1)
        log.info("worker %s ready: pid %d, %s, model %s, capacity %d tokens, %d × %s per sequence",
                 ready.name, ready.pid, ready.device, ready.model, ready.capacity_tokens, ready.output_dim,
                 ready.output_dtype)

    def _on_outcome(self, worker: WorkerState, message: Routed | Error) -> None:
        chunk_id = message.header["chunk_id"] if type(message) is Routed else message.chunk_id
        chunk = self.dispatcher.inflight.get(chunk_id)
        if chunk is None:
            metrics.DUPLICATE_RESULTS.inc()  # answered already, cancelled, or never known
            return
        if chunk.worker != worker.identity:
            if worker.identity in chunk.former_workers:
                metrics.DUPLICATE_RESULTS.inc()  # a late answer after the chunk was taken back
            else:
                self.refusals.refuse(_type_name(message), "not_assigned",
                                     "for chunk %s from worker %s, which was not given it", chunk_id, worker.name)
            return
        if type(message) is Routed:
            fault = wire.result_fault(message.header, chunk, worker)
            if fault is not None:
                reason, got, expected = fault
                self.refusals.refuse("RESULT", reason, "for chunk %s from worker %s: %s %r where %r is due",
                                     chunk_id, worker.name, reason, got, expected)
                return
            self.dispatcher.complete(chunk.chunk_id)
            # Forwarded as received: the header and the values frame are the worker's own buffers.
            self._answer(chunk, message.frames)
        else:
            self.dispatcher.complete(chunk.chunk_id)
            metrics.CHUNK_FAILURES.labels(message.code).inc()
            self._answer(chunk, message.encode())

    def _drop_worker(self, identity: bytes, reason: str) -> None:
        worker = self.dispatcher.workers.get(identity)
        if worker is None:
            return
        orphans = self.dispatcher.remove_worker(identity)
        metrics.DEAD_WORKERS.labels(reason).inc()
        metrics.forget_worker(worker.name)
        self.dispatch_counters.pop(worker.name, None)
        self.gauges_due = time.monotonic()
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
            self.dispatcher.enqueue(chunk, front=True, now=time.monotonic())

    def _hold_budget_s(self, worker: WorkerState, chunk: PendingChunk) -> float:
        """How long `worker` may hold `chunk` before it is given to another: a fixed allowance plus the
        time to run, at the slowest expected rate, the tokens it already holds and the chunk's own."""
        return self.chunk_hold_s + (worker.outstanding_tokens + chunk.num_tokens) / self.hold_tokens_per_s

    def _send_to_worker(self, chunk: PendingChunk, worker: WorkerState, as_received: bool = False) -> None:
        """Assign and send a chunk. `as_received`: it is dispatched in the turn it arrived, so its header
        still says what the frontend meant and goes out as packed; one that waited in the queue, or is
        sent again, carries a new header with the time it has left and its attempt."""
        now = time.monotonic()
        self.dispatcher.assign(chunk, worker, hold_until=now + self._hold_budget_s(worker, chunk))
        # The token frames always go out as the frontend sent them.
        if as_received and chunk.attempt == chunk.message.header.get("attempt", 0):
            frames = chunk.message.frames
        else:
            frames = chunk.message.with_header(timeout_s=max(0.0, chunk.deadline - now), attempt=chunk.attempt)
        send_frames(self.workers, frames, worker.identity)
        self.dispatch_counters[worker.name].inc()

    def _dispatch_queued(self) -> None:
        while (ready := self.dispatcher.take_dispatchable()) is not None:
            self._send_to_worker(*ready)

    def _heartbeat_workers(self, now: float) -> None:
        for worker in self.dispatcher.expired_workers(now):
            log.warning("worker %s missed %d heartbeats", worker.name, self.settings.liveness)
            self._drop_worker(worker.identity, "silent")
        beat = self._heartbeat()
        for identity in self.dispatcher.workers:
            send(self.workers, beat, identity)

    def _take_back_overdue(self, now: float) -> None:
        """A live worker that holds a chunk past its budget may never answer: give the chunk to another
        (the slow worker is told to drop it; its answer, should it come, is dropped as a duplicate)."""
        overdue = self.dispatcher.take_overdue(now)
        for chunk, worker in overdue:
            log.warning("worker %s held chunk %s past its budget; dispatching it again", worker.name,
                        chunk.chunk_id)
            metrics.CHUNK_TIMEOUTS.inc()
            send(self.workers, Cancel(chunk_id=chunk.chunk_id), worker.identity)
        self._requeue([chunk for chunk, _ in overdue])

    def _expire_queued(self, now: float) -> None:
        """Fail the waiting chunks past their deadline, and those that waited model_wait_s for a model
        no live worker serves (a draining one counts: it may still be replaced before it leaves)."""
        for chunk in self.dispatcher.take_expired_queued(now):
            if self.dispatcher.live_workers(chunk.model):
                self._fail(chunk, ErrorCode.EXPIRED, "the request's deadline passed while it waited for a worker")
            else:
                self._fail(chunk, ErrorCode.UNAVAILABLE, self._no_worker(chunk.model))
        wait_s = self.settings.model_wait_s
        orphaned = self.dispatcher.take_queued(
            lambda chunk: now - chunk.queued_at > wait_s and not self.dispatcher.live_workers(chunk.model))
        for chunk in orphaned:
            self._fail(chunk, ErrorCode.UNAVAILABLE, f"{self._no_worker(chunk.model)} (waited {wait_s:g} s)")

    def _no_worker(self, model: str) -> str:
        return f"no worker of {self.models.name(model)} is live" if model else "no worker is live"

    def _update_gauges(self) -> None:
        metrics.QUEUE_DEPTH.set(len(self.dispatcher.queued))
        metrics.LIVE_WORKERS.set(len(self.dispatcher.workers))
        for worker in self.dispatcher.workers.values():
            metrics.INFLIGHT_CHUNKS.labels(worker.name).set(len(worker.inflight))
            metrics.INFLIGHT_TOKENS.labels(worker.name).set(worker.outstanding_tokens)


def _type_name(message: Message | Routed) -> str:
    return message.type.name if isinstance(message, Routed) else message.TYPE.name
