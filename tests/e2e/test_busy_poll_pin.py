"""Busy polling with the I/O threads on the poller's CPU (common/wakeups.py), in real processes: while
traffic flows, each of the broker, a worker (both link arrangements) and the frontend has its ZeroMQ I/O
threads on one CPU; once its window has passed, none; with --no-busy-poll-pin, never."""

from __future__ import annotations

import os
import threading
import time

import httpx
import pytest

from tests.cluster import Cluster

pytestmark = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two CPUs")

WINDOW = ["--busy-poll-us", "100000"]  # shorter than the heartbeat interval: idle processes leave their window


def pinned_threads(pid: int) -> int:
    """Threads of `pid` allowed on a single CPU."""
    count = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            if len(os.sched_getaffinity(int(tid))) == 1:
                count += 1
        except OSError:
            continue
    return count


def sample(cluster: Cluster, seconds: float, until: dict[str, bool] | None = None) -> dict[str, set[int]]:
    """Per process (broker, worker0, frontend): the pinned-thread counts seen over `seconds`, sampled every
    5 ms; ends early once every process has shown a count for which `until[name]` says (pinned or not)."""
    processes = {p.name: p.popen.pid for p in cluster.processes() if p.popen is not None}
    seen: dict[str, set[int]] = {name: set() for name in processes}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for name, pid in processes.items():
            seen[name].add(pinned_threads(pid))
        if until is not None and all(any((count > 0) == until[name] for count in seen[name]) for name in seen):
            break
        time.sleep(0.005)
    return seen


def traffic(url: str, stop: threading.Event) -> None:
    with httpx.Client(timeout=30) as client:
        while not stop.is_set():
            assert client.post(url + "/v1/embeddings", json={"input": "a short text"}).status_code == 200


@pytest.mark.parametrize("link_thread", ["off", "on"], ids=["inline-link", "threaded-link"])
def test_io_threads_are_pinned_while_traffic_flows_and_released_after(link_thread: str) -> None:
    with Cluster(workers=1, broker_args=WINDOW, frontend_args=WINDOW,
                 worker_args=[*WINDOW, "--link-thread", link_thread]) as cluster:
        stop = threading.Event()
        sender = threading.Thread(target=traffic, args=(cluster.url, stop))
        sender.start()
        try:
            busy = sample(cluster, 20.0, until={"broker": True, "worker0": True, "frontend": True})
        finally:
            stop.set()
            sender.join()
        assert all(max(counts) >= 1 for counts in busy.values()), busy
        idle = sample(cluster, 10.0, until={"broker": False, "worker0": False, "frontend": False})
        assert all(0 in counts for counts in idle.values()), idle


def test_nothing_is_pinned_without_the_option() -> None:
    off = [*WINDOW, "--no-busy-poll-pin"]
    with Cluster(workers=1, broker_args=off, frontend_args=off, worker_args=[*off, "--link-thread", "off"]) as cluster:
        stop = threading.Event()
        sender = threading.Thread(target=traffic, args=(cluster.url, stop))
        sender.start()
        try:
            busy = sample(cluster, 2.0)
        finally:
            stop.set()
            sender.join()
        assert all(counts == {0} for counts in busy.values()), busy
