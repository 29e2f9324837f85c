"""sd_notify spoken to real datagram sockets: by the module, by a scheduler loop, and by every process."""

from __future__ import annotations

import os
import queue
import signal
import socket
import threading
import time
import types
import uuid

import numpy as np
import pytest

from quiver.common import sdnotify
from tests.ops.conftest import WATCHDOG_S, wait_for_ready_children


def receive(sock: socket.socket) -> str:
    sock.settimeout(2)
    return sock.recv(4096).decode()


@pytest.fixture
def path_socket(tmp_path, monkeypatch):
    path = str(tmp_path / "notify.sock")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    monkeypatch.setenv("NOTIFY_SOCKET", path)
    yield sock
    sock.close()


def test_ready_stopping_status_to_a_socket_path(path_socket):
    assert sdnotify.ready("serving model x")
    assert receive(path_socket) == "READY=1\nSTATUS=serving model x"
    assert sdnotify.status("busy")
    assert receive(path_socket) == "STATUS=busy"
    assert sdnotify.stopping()
    assert receive(path_socket) == "STOPPING=1"


def test_abstract_socket_name(monkeypatch):
    name = f"quiver-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sdnotify.notify("WATCHDOG=1")
        assert receive(sock) == "WATCHDOG=1"
    finally:
        sock.close()


def test_without_systemd_nothing_is_sent_and_nothing_fails(monkeypatch, tmp_path):
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert not sdnotify.ready()
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "nobody-listens"))
    assert not sdnotify.ready()  # logged once, never raised
    monkeypatch.setenv("NOTIFY_SOCKET", "vsock:2:1234")
    assert not sdnotify.notify("READY=1")


def test_watchdog_interval_follows_systemd_variables(monkeypatch):
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert sdnotify.watchdog_interval_s() is None
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    assert sdnotify.watchdog_interval_s() == 30.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert sdnotify.watchdog_interval_s() == 30.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))  # meant for another process
    assert sdnotify.watchdog_interval_s() is None
    assert not sdnotify.Watchdog.from_environment().enabled


def test_watchdog_pings_at_most_every_half_timeout(path_socket):
    dog = sdnotify.Watchdog(timeout_s=0.4)
    for _ in range(1000):
        dog.kick()
    assert receive(path_socket) == "WATCHDOG=1"
    assert dog.sent == 1
    time.sleep(0.25)
    dog.kick()
    assert receive(path_socket) == "WATCHDOG=1" and dog.sent == 2


class BlockingEngine:
    """A stand-in engine whose step waits while `hold` is clear: a hung GPU on demand."""

    def __init__(self) -> None:
        model = types.SimpleNamespace(kind="embedding", tasks=["embed", "tokens"], vocab_size=100, max_input_length=64,
                                      uses_token_types=False)
        self.info = types.SimpleNamespace(model=model, output_dim=4, device="cpu")
        self.hold = threading.Event()
        self.hold.set()

    def step(self, batch):
        self.hold.wait()
        rows = np.ones((batch.num_seqs, 4), dtype=np.float32)
        return types.SimpleNamespace(wait=lambda copy=True: rows, release=lambda: None)


def test_the_scheduler_loop_pets_the_watchdog_and_stops_when_it_hangs(path_socket):
    from quiver.common.protocol import Chunk
    from quiver.worker import metrics
    from quiver.worker.scheduler import Scheduler

    engine = BlockingEngine()
    sent: list = []
    scheduler = Scheduler(engine, send=sent.append, worker_name="t", max_batch_tokens=64, max_batch_seqs=8)
    inbox: queue.Queue = queue.Queue()
    stop, drain = threading.Event(), threading.Event()
    metrics.loop_tick.watchdog = sdnotify.Watchdog(timeout_s=0.2)
    loop = threading.Thread(target=scheduler.run, args=(inbox, stop, drain), daemon=True)
    loop.start()
    try:
        path_socket.settimeout(1)
        assert path_socket.recv(64) == b"WATCHDOG=1"  # pets while idle
        assert path_socket.recv(64) == b"WATCHDOG=1"
        engine.hold.clear()  # the next step hangs
        inbox.put(Chunk(chunk_id="c1", task="embed", num_seqs=1, num_tokens=3, normalize=True, timeout_s=30,
                        has_token_types=False, input_ids=np.array([1, 2, 3], dtype=np.int32),
                        seq_lens=np.array([3], dtype=np.int32), token_type_ids=None))
        time.sleep(0.3)  # the step has started and blocks
        path_socket.setblocking(False)
        while True:  # whatever was sent before the hang
            try:
                path_socket.recv(64)
            except BlockingIOError:
                break
        time.sleep(0.5)  # five watchdog periods of silence: systemd would restart this worker
        with pytest.raises(BlockingIOError):
            path_socket.recv(64)
        engine.hold.set()  # it recovers, answers, and pets again
        path_socket.settimeout(2)
        assert path_socket.recv(64) == b"WATCHDOG=1"
        end = time.monotonic() + 5
        while not sent and time.monotonic() < end:
            time.sleep(0.01)
        assert [type(m).__name__ for m in sent] == ["Result"]
        assert metrics.LOOP_TIMESTAMP._value.get() > time.time() - 5
    finally:
        metrics.loop_tick.watchdog = None
        engine.hold.set()
        stop.set()
        loop.join(5)


# ---- every process of a live cluster, under the abstract socket the ops cluster runs with ------------


def test_every_process_says_ready_and_the_loops_pet_the_watchdog(ops_cluster, notify_socket):
    broker = ops_cluster.broker.popen.pid
    workers = [proc.popen.pid for proc in ops_cluster.worker_procs]
    notify_socket.wait_for(broker, "READY=1", timeout=5)
    for proc in ops_cluster.worker_procs:
        note = notify_socket.wait_for(proc.popen.pid, "READY=1", timeout=5)
        assert any(line.startswith("STATUS=serving ") for line in note.lines)
    # uvicorn's parent binds the socket; each HTTP process says READY=1 once it serves.
    wait_for_ready_children(notify_socket, ops_cluster.frontend.popen.pid, 2, timeout=5)

    # The broker's poll loop and each worker's scheduler loop pet the watchdog every WATCHDOG_S / 2.
    start = time.monotonic()
    time.sleep(2.5 * WATCHDOG_S)
    for pid in (broker, *workers):
        pings = [n for n in notify_socket.from_pid(pid) if n.lines == ["WATCHDOG=1"] and n.at >= start]
        assert len(pings) >= 3, f"pid {pid} sent {len(pings)} watchdog pings in {2.5 * WATCHDOG_S} s"
        gaps = np.diff([n.at for n in pings])
        assert gaps.max() < WATCHDOG_S, f"pid {pid}: a gap of {gaps.max():.2f} s between pings"


def test_a_worker_says_ready_only_after_loading_and_stopping_when_it_drains(ops_cluster, notify_socket):
    proc = ops_cluster.start_worker(index=len(ops_cluster.worker_procs), extra=["--name", "notify-probe"])
    try:
        notify_socket.wait_for(proc.popen.pid, "READY=1", timeout=120)
        assert "engine ready" in proc.log(), "READY=1 came before the engine was loaded"
        first = notify_socket.from_pid(proc.popen.pid)[0]
        assert "READY=1" in first.lines, f"{first.lines} came before READY=1"
        proc.signal(signal.SIGTERM)
        notify_socket.wait_for(proc.popen.pid, "STOPPING=1", timeout=10)
        assert proc.wait(30) == 0
    finally:
        proc.signal(signal.SIGKILL)
        ops_cluster.worker_procs.remove(proc)
