"""A live cluster for the ops tests: a broker, two CPU workers and a two-process frontend, each
serving /metrics, all started under a real systemd-style notification socket.

The socket (abstract, like the one systemd gives a unit) records every datagram with the sender's
pid from its SCM_CREDENTIALS, as systemd does to tell which process spoke.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.cluster import Cluster, free_port

REPO = Path(__file__).resolve().parents[2]
OPS = REPO / "ops"
WATCHDOG_S = 2.0


@dataclass
class Notification:
    pid: int
    lines: list[str]
    at: float


@dataclass
class NotifySocket:
    """A datagram socket like systemd's NOTIFY_SOCKET that keeps what each pid sent."""

    name: str = field(default_factory=lambda: f"@quiver-test-notify-{os.getpid()}-{uuid.uuid4().hex[:8]}")

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        address = "\0" + self.name[1:] if self.name.startswith("@") else self.name
        self.sock.bind(address)
        self.sock.settimeout(0.2)
        self.received: list[Notification] = []
        self.lock = threading.Lock()
        self.closed = False
        self.thread = threading.Thread(target=self._receive, daemon=True)
        self.thread.start()

    def _receive(self) -> None:
        size = socket.CMSG_SPACE(struct.calcsize("iII"))
        while not self.closed:
            try:
                data, ancillary, _flags, _address = self.sock.recvmsg(4096, size)
            except TimeoutError:
                continue
            except OSError:
                return
            pid = -1
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = struct.unpack("iII", payload[: struct.calcsize("iII")])[0]
            with self.lock:
                self.received.append(Notification(pid, data.decode().split("\n"), time.monotonic()))

    def from_pid(self, pid: int) -> list[Notification]:
        with self.lock:
            return [n for n in self.received if n.pid == pid]

    def wait_for(self, pid: int, line: str, timeout: float = 60.0) -> Notification:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for note in self.from_pid(pid):
                if line in note.lines:
                    return note
            time.sleep(0.05)
        raise AssertionError(f"pid {pid} did not send {line!r} in {timeout} s; it sent {self.from_pid(pid)}")

    def close(self) -> None:
        self.closed = True
        self.sock.close()


@pytest.fixture(scope="package")
def notify_socket():
    sock = NotifySocket()
    yield sock
    sock.close()


@pytest.fixture(scope="package")
def ops_cluster(notify_socket):
    """The cluster, with `metrics_urls` {role: [url, ...]} of every /metrics it serves."""
    broker_port = free_port()
    worker_ports = [free_port(), free_port()]
    cluster = Cluster(
        workers=0,
        broker_args=["--metrics-port", str(broker_port)],
        frontend_args=["--http-processes", "2"],
        env={"NOTIFY_SOCKET": notify_socket.name, "WATCHDOG_USEC": str(int(WATCHDOG_S * 1e6))},
    )
    cluster.start_broker()
    for port in worker_ports:
        cluster.start_worker(extra=["--metrics-port", str(port)])
    cluster.start_frontend()
    try:
        cluster.wait_live_workers(2, timeout=120)
        # The frontend answers once one HTTP process serves; wait for the other too, so every scrape
        # below may land on either.
        wait_for_ready_children(notify_socket, cluster.frontend.popen.pid, 2)
    except BaseException:
        cluster.stop()
        raise
    cluster.metrics_ports = {"frontend": [cluster.http_port], "broker": [broker_port], "worker": worker_ports}
    cluster.metrics_urls = {role: [f"http://127.0.0.1:{port}/metrics" for port in ports]
                            for role, ports in cluster.metrics_ports.items()}
    yield cluster
    cluster.stop()


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return found


def wait_for_ready_children(notify: NotifySocket, parent: int, count: int, timeout: float = 60.0) -> list[int]:
    """The pids of `count` children of `parent` that said READY=1."""
    end = time.monotonic() + timeout
    ready: list[int] = []
    while time.monotonic() < end:
        ready = [pid for pid in children_of(parent)
                 if any("READY=1" in note.lines for note in notify.from_pid(pid))]
        if len(ready) >= count:
            return ready
        time.sleep(0.1)
    raise AssertionError(f"{len(ready)} of {count} children of {parent} said READY=1")


def embed(cluster: Cluster, texts: list[str], route: str = "/embed") -> httpx.Response:
    body = {"inputs": texts} if route == "/embed" else {"input": texts}
    return httpx.post(cluster.url + route, json=body, timeout=60)
