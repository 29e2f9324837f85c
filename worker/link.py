"""The worker's link to the broker: one DEALER socket, kept alive, in one of two arrangements.

BrokerConnection owns the socket and what keeps it alive (the Paranoid Pirate pattern): READY on
connect, a heartbeat every interval, and when the broker has been silent for the liveness window a
back-off, then a new socket and READY again (chunks already delivered to the old socket are read first).
It is used from one thread at a time and never blocks.

- InlineLink (GPU workers by default): the scheduler's own thread polls the socket. A chunk wakes the
  thread that runs it, and a result leaves from the thread that finished it: no hand-off between
  threads on a request's path (bench/floor.py measures a hand-off there and back at 120-150 µs on an
  H200 host; against the link thread, this took 0.3-0.5 ms off a batch-1 request there, 2026-12-03).
  Heartbeats go out from the scheduler's loop, which on a GPU goes round at least once per step (steps
  are launched asynchronously and last milliseconds), so a live worker never looks silent.
  A forward pass that hangs stops the heartbeats: the broker counts the worker dead after the liveness
  window and re-dispatches its chunks, and StallWatchdog ends the process for a restart.
- BrokerLink (CPU workers by default): a thread of its own polls the socket and hands chunks to the
  scheduler through a queue, and results come back through an inproc PUSH socket. A CPU forward pass
  holds the scheduler's thread for its whole length (seconds, at a full budget), so only a thread of
  its own keeps heartbeats going meanwhile; when the scheduler hangs, it tells the broker before exiting.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import queue
import secrets
import threading
import time
from typing import Callable

import zmq

from quiver.common.config import WorkerSettings
from quiver.common.protocol import (
    Cancel, Chunk, Disconnect, Heartbeat, Message, ProtocolError, Ready, Reconnect,
)
from quiver.common.security import client_from
from quiver.common.transport import make_socket, recv, recv_frames, send, send_frames
from quiver.common.wakeups import SpinCore
from quiver.worker import metrics

log = logging.getLogger("quiver.worker.link")

MAX_RECONNECT_BACKOFF_S = 8.0
EXIT_STALLED = 70  # EX_SOFTWARE: the scheduler hung; a supervisor should start the worker again
IDLE_POLL_MS = 100.0  # an idle poll wakes this often at least (heartbeats, the stop flag)
_POLLIN = int(zmq.POLLIN)


class BrokerConnection:
    """The DEALER socket to the broker, kept alive; `deliver` gets each chunk and cancel it reads."""

    def __init__(self, ctx: zmq.Context, settings: WorkerSettings, ready: Ready,
                 deliver: Callable[[Chunk | Cancel], None]) -> None:
        self.ctx = ctx
        self.settings = settings
        self.ready = ready
        self.deliver = deliver
        self.curve = client_from(settings.curve_secret_key, settings.curve_broker_key)
        # Secret (128 random bits): the broker lets a peer presenting it take this worker's route.
        self.identity = secrets.token_hex(16).encode()
        self.draining = False  # set from a signal handler: the next heartbeat says so
        self._announced_draining = False
        self.interval = settings.heartbeat_interval_s
        self.next_heartbeat = time.monotonic() + self.interval
        self.backoff = self.interval
        self.reconnect_at: float | None = None  # set while the broker is silent: when to replace the socket
        self.last_contact = time.monotonic()
        self.sock = self._connect()

    def _connect(self) -> zmq.Socket:
        sock = make_socket(self.ctx, zmq.DEALER, identity=self.identity)
        if self.curve is not None:
            self.curve.apply(sock)
        sock.connect(self.settings.broker)
        send(sock, self.ready)
        return sock

    def send(self, message: Message) -> None:
        send(self.sock, message)

    def readable(self) -> bool:
        events = self.sock.getsockopt(zmq.EVENTS)
        return isinstance(events, int) and bool(events & _POLLIN)

    def read(self) -> bool:
        """Read every message waiting on the socket; True if there was any."""
        got = False
        while self.readable():
            try:
                message = recv(self.sock)
            except zmq.Again:
                break
            except ProtocolError as exc:
                metrics.BAD_MESSAGES.inc()
                log.warning("dropped a malformed message from the broker: %s", exc)
                continue
            got = True
            self.last_contact = time.monotonic()
            self.backoff = self.interval
            if isinstance(message, (Chunk, Cancel)):
                self.deliver(message)
            elif isinstance(message, Reconnect):
                log.info("the broker does not know this worker; registering again")
                send(self.sock, self.ready)
            elif isinstance(message, Disconnect):
                log.warning("the broker sent DISCONNECT: %s", message.reason)
            elif not isinstance(message, Heartbeat):
                metrics.BAD_MESSAGES.inc()
                log.warning("the broker sent %s, which brokers do not send", type(message).__name__)
        return got

    def poll_ms(self) -> int:
        """How long a poll may sleep (whole milliseconds) before this connection has something to do."""
        return math.ceil(min(IDLE_POLL_MS, max(0.0, self.next_heartbeat - time.monotonic()) * 1000))

    def keep_alive(self, now: float) -> bool:
        """Heartbeats and reconnects, due by `now`; True when the socket was replaced."""
        replaced = False
        if now - self.last_contact > self.settings.liveness_window_s:
            if self.reconnect_at is None:
                log.warning("broker silent for %.1f s; reconnecting in %.1f s", now - self.last_contact, self.backoff)
                self.reconnect_at = now + self.backoff
            elif now >= self.reconnect_at:
                self._replace_socket()
                replaced = True
        else:
            self.reconnect_at = None  # the broker spoke during the back-off (say, it restarted): keep this socket
        if now >= self.next_heartbeat or self.draining != self._announced_draining:
            send(self.sock, Heartbeat(draining=self.draining))
            self._announced_draining = self.draining
            self.next_heartbeat = now + self.interval
        return replaced

    def _replace_socket(self) -> None:
        metrics.BROKER_RECONNECTS.inc()
        backoff = self.backoff
        self.read()  # chunks already delivered to the old socket are not lost with it
        self.sock.close()
        self.sock = self._connect()
        self.last_contact = time.monotonic()
        self.reconnect_at = None
        self.backoff = min(backoff * 2, MAX_RECONNECT_BACKOFF_S)

    def close(self, reason: str, linger_ms: int = 0) -> None:
        send(self.sock, Disconnect(reason=reason))
        self.sock.close(linger=linger_ms)


class InlineLink:
    """The broker socket polled from the scheduler's thread: the scheduler's inbox (get, get_nowait,
    empty, as queue.SimpleQueue's) and its `send`."""

    def __init__(self, ctx: zmq.Context, settings: WorkerSettings, ready: Ready) -> None:
        self.pending: collections.deque[Chunk | Cancel] = collections.deque()
        # Before the context's first socket: it finds libzmq's I/O threads by starting them.
        self.spin_core = SpinCore(ctx, enabled=settings.busy_poll_pin and settings.busy_poll_us > 0)
        self.connection = BrokerConnection(ctx, settings, ready, self.pending.append)
        self.spin_s = settings.busy_poll_us / 1e6
        self.watchdog_s = settings.watchdog_s
        self.last_message = 0.0
        self.just_read = False  # the last service read the socket dry; nothing came since, as far as we know

    def send(self, message: Message) -> None:
        self.connection.send(message)

    def _service(self, wait_s: float) -> None:
        connection = self.connection
        if not connection.readable() and wait_s > 0:
            # Right after traffic, poll without sleeping for a moment, on one CPU with the I/O threads.
            now = time.monotonic()
            if now - self.last_message < self.spin_s:
                end = min(now + wait_s, self.last_message + self.spin_s)
                self.spin_core.hold()
                while not connection.readable() and time.monotonic() < end:
                    self.spin_core.spin_turn()
            if not connection.readable():
                self.spin_core.release()
                connection.sock.poll(min(math.ceil(wait_s * 1000), connection.poll_ms()))
        now = time.monotonic()
        self.just_read = connection.read()
        if self.just_read:
            self.last_message = now
        connection.keep_alive(now)

    def get(self, block: bool = True, timeout: float | None = None) -> Chunk | Cancel:
        if not self.pending:
            if not block:
                if self.just_read:
                    # The scheduler drains the inbox right after a read that emptied the socket: polling it
                    # again at once would find nothing (the next turn of the scheduler's loop polls).
                    self.just_read = False
                    raise queue.Empty
                self._service(0.0)
            else:
                self._service(IDLE_POLL_MS / 1000 if timeout is None else timeout)
        if not self.pending:
            raise queue.Empty
        return self.pending.popleft()

    def get_nowait(self) -> Chunk | Cancel:
        return self.get(block=False)

    def empty(self) -> bool:
        if not self.pending:
            self._service(0.0)
        return not self.pending

    @property
    def inbox(self) -> InlineLink:
        return self

    def start(self, stalled_for: Callable[[float], float]) -> None:
        if self.watchdog_s > 0:
            StallWatchdog(self.watchdog_s, stalled_for).start()

    def drain(self) -> None:
        self.connection.draining = True

    def wait_turn(self) -> None:
        """One turn of the scheduler's wait for the device: the CPU goes to the I/O threads while they share it, else to
        any thread, and the GIL to the process's other threads (CUDA's own wait released it)."""
        if self.spin_core.held:
            self.spin_core.spin_turn()
        else:
            os.sched_yield()

    def close(self) -> None:
        self.spin_core.release()
        self.connection.close("worker stopping")


class StallWatchdog(threading.Thread):
    """With an InlineLink: ends the process when the scheduler's loop has not gone round for the
    watchdog interval (a hung forward pass). Its heartbeats stopped with it, so the broker has already
    counted the worker dead and re-dispatched its chunks."""

    def __init__(self, watchdog_s: float, stalled_for: Callable[[float], float]) -> None:
        super().__init__(name="stall-watchdog", daemon=True)
        self.watchdog_s = watchdog_s
        self.stalled_for = stalled_for

    def run(self) -> None:
        while True:
            time.sleep(min(1.0, self.watchdog_s / 4))
            if self.stalled_for(time.monotonic()) > self.watchdog_s:
                log.error("the scheduler made no progress for %.0f s; exiting", self.watchdog_s)
                logging.shutdown()
                os._exit(EXIT_STALLED)


class BrokerLink(threading.Thread):
    """The broker socket polled from a thread of its own: chunks and cancels go into `inbox`, results the
    scheduler pushes into the inproc PUSH socket at `outbox_endpoint` go out to the broker."""

    def __init__(self, ctx: zmq.Context, settings: WorkerSettings, ready: Ready,
                 inbox: queue.SimpleQueue[Chunk | Cancel], outbox_endpoint: str, spin_core: SpinCore) -> None:
        super().__init__(name="broker-link", daemon=True)
        self.spin_core = spin_core
        self.stalled_for: Callable[[float], float] = lambda now: 0.0  # the scheduler's, set before start
        self.ctx = ctx
        self.settings = settings
        self.ready = ready
        self.inbox = inbox
        self.outbox_endpoint = outbox_endpoint
        self.draining = False
        self.stopping = threading.Event()

    def stop(self) -> None:
        self.stopping.set()

    def run(self) -> None:
        outbox = make_socket(self.ctx, zmq.PULL)
        outbox.bind(self.outbox_endpoint)
        connection = BrokerConnection(self.ctx, self.settings, self.ready, self.inbox.put)
        poller = zmq.Poller()
        poller.register(connection.sock, zmq.POLLIN)
        poller.register(outbox, zmq.POLLIN)
        spin_s = self.settings.busy_poll_us / 1e6
        last_message = 0.0
        while not self.stopping.is_set():
            # Right after traffic, poll without sleeping for a moment, on one CPU with the I/O threads.
            spinning = time.monotonic() - last_message < spin_s
            if spinning:
                self.spin_core.hold()
            else:
                self.spin_core.release()
            events = dict(poller.poll(0 if spinning else connection.poll_ms()))
            if events:
                last_message = time.monotonic()
            elif spinning:
                self.spin_core.spin_turn()
            if outbox in events:
                self._forward_outbox(outbox, connection.sock)
            if connection.sock in events:
                connection.read()
            now = time.monotonic()
            if self._scheduler_hung(now):
                self._leave_hung(connection)
            connection.draining = self.draining
            if connection.keep_alive(now):
                poller = zmq.Poller()
                poller.register(connection.sock, zmq.POLLIN)
                poller.register(outbox, zmq.POLLIN)
        self.spin_core.release()
        self._forward_outbox(outbox, connection.sock)
        connection.close("worker stopping")
        outbox.close()

    def _scheduler_hung(self, now: float) -> bool:
        watchdog = self.settings.watchdog_s
        return watchdog > 0 and not self.stopping.is_set() and self.stalled_for(now) > watchdog

    def _leave_hung(self, connection: BrokerConnection) -> None:
        """A forward pass has not returned for the watchdog interval: nothing in this process can end
        it, so leave the broker (it re-dispatches our chunks at once) and exit for a restart."""
        log.error("the scheduler made no progress for %.0f s; leaving the broker and exiting",
                  self.settings.watchdog_s)
        connection.close("worker hung: no progress within the watchdog interval", linger_ms=1000)
        logging.shutdown()
        os._exit(EXIT_STALLED)

    @staticmethod
    def _forward_outbox(outbox: zmq.Socket, sock: zmq.Socket) -> None:
        while True:
            try:
                frames = recv_frames(outbox)
            except zmq.Again:
                return
            send_frames(sock, frames)


class ThreadedLink:
    """A BrokerLink thread and the two ends the scheduler uses: its inbox queue and a PUSH socket for results."""

    def __init__(self, ctx: zmq.Context, settings: WorkerSettings, ready: Ready) -> None:
        endpoint = f"inproc://worker-outbox-{os.getpid()}"
        # Before the context's first socket: it finds libzmq's I/O threads by starting them.
        spin_core = SpinCore(ctx, enabled=settings.busy_poll_pin and settings.busy_poll_us > 0)
        self.outbox = make_socket(ctx, zmq.PUSH)
        self.outbox.connect(endpoint)
        # SimpleQueue's put and get are one C-level lock each (queue.Queue's take a condition variable and
        # several Python-level locks), measured ~7 µs less per hand-off on an idle pair of threads.
        self.inbox: queue.SimpleQueue[Chunk | Cancel] = queue.SimpleQueue()
        self.thread = BrokerLink(ctx, settings, ready, self.inbox, endpoint, spin_core)

    def send(self, message: Message) -> None:
        send(self.outbox, message)

    def start(self, stalled_for: Callable[[float], float]) -> None:
        self.thread.stalled_for = stalled_for
        self.thread.start()

    def drain(self) -> None:
        self.thread.draining = True

    def close(self) -> None:
        self.thread.stop()
        if self.thread.ident is not None:  # started: it says DISCONNECT on its way out
            self.thread.join(timeout=5)
        self.outbox.close()


def open_link(ctx: zmq.Context, settings: WorkerSettings, ready: Ready) -> InlineLink | ThreadedLink:
    """The arrangement the settings ask for (module docstring): by default inline on a GPU, threaded on a CPU."""
    threaded = settings.device == "cpu" if settings.link_thread == "auto" else settings.link_thread == "on"
    return ThreadedLink(ctx, settings, ready) if threaded else InlineLink(ctx, settings, ready)
