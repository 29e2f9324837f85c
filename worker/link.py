"""The worker's I/O thread: the only owner of the DEALER socket to the broker.

Incoming chunks and cancels go into a queue the scheduler reads; results the scheduler pushes into
an inproc PUSH socket come out here and go to the broker. Socket work thus overlaps model work.
Heartbeats follow the Paranoid Pirate pattern: one every interval, and when the broker has been
silent for the liveness window the socket is replaced and READY sent again, with a backoff.
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import threading
import time
from typing import Callable

import zmq

from quiver.common.config import WorkerSettings
from quiver.common.protocol import Cancel, Chunk, Disconnect, Heartbeat, ProtocolError, Ready, Reconnect
from quiver.common.security import client_from
from quiver.common.transport import make_socket, recv, recv_frames, send, send_frames

log = logging.getLogger("quiver.worker.link")

MAX_RECONNECT_BACKOFF_S = 8.0
EXIT_STALLED = 70  # EX_SOFTWARE: the scheduler hung; a supervisor should start the worker again


class BrokerLink(threading.Thread):
    def __init__(self, ctx: zmq.Context, settings: WorkerSettings, ready: Ready,
                 inbox: queue.SimpleQueue[Chunk | Cancel], outbox_endpoint: str,
                 stalled_for: Callable[[float], float]) -> None:
        super().__init__(name="broker-link", daemon=True)
        self.stalled_for = stalled_for
        self.curve = client_from(settings.curve_secret_key, settings.curve_broker_key)
        self.ctx = ctx
        self.settings = settings
        self.ready = ready
        self.inbox = inbox
        self.outbox_endpoint = outbox_endpoint
        # Secret (128 random bits): the broker lets a peer presenting it take this worker's route.
        self.identity = secrets.token_hex(16).encode()
        self.draining = False
        self.stopping = threading.Event()
        self.connected_once = threading.Event()
        self.bad_messages = 0
        self.reconnects = 0
        self.last_broker_contact = time.monotonic()

    def stop(self) -> None:
        self.stopping.set()

    def _connect(self) -> zmq.Socket:
        sock = make_socket(self.ctx, zmq.DEALER, identity=self.identity)
        if self.curve is not None:
            self.curve.apply(sock)
        sock.connect(self.settings.broker)
        send(sock, self.ready)
        return sock

    def run(self) -> None:
        outbox = make_socket(self.ctx, zmq.PULL)
        outbox.bind(self.outbox_endpoint)
        sock = self._connect()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(outbox, zmq.POLLIN)
        interval = self.settings.heartbeat_interval_s
        next_heartbeat = time.monotonic() + interval
        backoff = interval
        announced_draining = False
        spin_s = self.settings.busy_poll_us / 1e6
        last_message = 0.0
        self.last_broker_contact = time.monotonic()
        while not self.stopping.is_set():
            # Right after traffic, poll without sleeping for a moment (see BrokerSettings.busy_poll_us).
            spinning = time.monotonic() - last_message < spin_s
            timeout_ms = 0 if spinning else min(100.0, max(0.0, next_heartbeat - time.monotonic()) * 1000)
            events = dict(poller.poll(timeout_ms))
            if events:
                last_message = time.monotonic()
            if outbox in events:
                self._forward_outbox(outbox, sock)
            if sock in events:
                self._read_broker(sock)
                backoff = interval
            now = time.monotonic()
            if self._scheduler_hung(now):
                self._leave_hung(sock)
            if now - self.last_broker_contact > self.settings.liveness_window_s:
                log.warning("broker silent for %.1f s; reconnecting in %.1f s",
                            now - self.last_broker_contact, backoff)
                if self._heard_within(sock, backoff):
                    backoff = interval  # the broker spoke during the back-off (say, it restarted): keep this socket
                    continue
                if self.stopping.is_set():
                    break
                poller.unregister(sock)
                self._read_broker(sock)  # chunks already delivered to the old socket are not lost with it
                sock.close()
                sock = self._connect()
                poller.register(sock, zmq.POLLIN)
                self.reconnects += 1
                self.last_broker_contact = time.monotonic()
                backoff = min(backoff * 2, MAX_RECONNECT_BACKOFF_S)
                continue
            if now >= next_heartbeat or self.draining != announced_draining:
                send(sock, Heartbeat(draining=self.draining))
                announced_draining = self.draining
                next_heartbeat = now + interval
        self._forward_outbox(outbox, sock)
        send(sock, Disconnect(reason="worker stopping"))
        sock.close()
        outbox.close()

    def _heard_within(self, sock: zmq.Socket, timeout_s: float) -> bool:
        """Wait up to timeout_s (or until stopping) for the broker on `sock`, reading what it sends; True if
        it spoke. The socket reconnects by itself, so a broker back from a restart may be on it already."""
        contact = self.last_broker_contact
        end = time.monotonic() + timeout_s
        while not self.stopping.is_set() and time.monotonic() < end:
            if sock.poll(int(min(100.0, max(0.0, end - time.monotonic()) * 1000))):
                self._read_broker(sock)
                if self.last_broker_contact > contact:
                    return True
        return False

    def _scheduler_hung(self, now: float) -> bool:
        watchdog = self.settings.watchdog_s
        return watchdog > 0 and not self.stopping.is_set() and self.stalled_for(now) > watchdog

    def _leave_hung(self, sock: zmq.Socket) -> None:
        """A forward pass has not returned for the watchdog interval: nothing in this process can end
        it, so leave the broker (it re-dispatches our chunks at once) and exit for a restart."""
        log.error("the scheduler made no progress for %.0f s; leaving the broker and exiting",
                  self.settings.watchdog_s)
        send(sock, Disconnect(reason="worker hung: no progress within the watchdog interval"))
        sock.close(linger=1000)
        logging.shutdown()
        os._exit(EXIT_STALLED)

    def _forward_outbox(self, outbox: zmq.Socket, sock: zmq.Socket) -> None:
        while True:
            try:
                frames = recv_frames(outbox)
            except zmq.Again:
                return
            send_frames(sock, frames)

    def _read_broker(self, sock: zmq.Socket) -> None:
        while True:
            try:
                message = recv(sock)
            except zmq.Again:
                return
            except ProtocolError as exc:
                self.bad_messages += 1
                log.warning("dropped a malformed message from the broker: %s", exc)
                continue
            self.last_broker_contact = time.monotonic()
            self.connected_once.set()
            if isinstance(message, (Chunk, Cancel)):
                self.inbox.put(message)
            elif isinstance(message, Reconnect):
                log.info("the broker does not know this worker; registering again")
                send(sock, self.ready)
            elif isinstance(message, Disconnect):
                log.warning("the broker sent DISCONNECT: %s", message.reason)
            elif not isinstance(message, Heartbeat):
                self.bad_messages += 1
                log.warning("the broker sent %s, which brokers do not send", type(message).__name__)
