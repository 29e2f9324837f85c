"""Busy polling in the frontend (frontend/keep_awake.py): the loop does not sleep while the window is open,
sleeps while thread work is in flight, and stops spinning once the window has passed."""

from __future__ import annotations

import asyncio
import os
import threading
import time

import httpx
import numpy as np
import pytest

from quiver.frontend import metrics
from quiver.frontend.keep_awake import PAUSE_S, THREAD_WORK, CountedPool, KeepAwake


def _wait_for(condition, timeout_s: float = 5.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.001)


def test_counted_pools_count_jobs_from_submission_until_done_or_cancelled():
    before = THREAD_WORK.in_flight
    release = threading.Event()
    pool = CountedPool(1)
    try:
        running = pool.submit(release.wait)
        queued = pool.submit(lambda: None)
        assert THREAD_WORK.in_flight == before + 2
        assert queued.cancel()
        assert THREAD_WORK.in_flight == before + 1
        release.set()
        running.result(timeout=5)
        _wait_for(lambda: THREAD_WORK.in_flight == before)
    finally:
        release.set()
        pool.shutdown()


class _SelectTimeouts:
    """Wraps the loop's selector: the timeout of every poll, None meaning 'until something happens'."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.timeouts: list[float | None] = []
        selector = loop._selector  # type: ignore[attr-defined]
        inner = selector.select

        def select(timeout=None):
            self.timeouts.append(timeout)
            return inner(timeout)

        selector.select = select


def test_the_loop_polls_without_sleeping_while_busy_and_for_the_window_then_sleeps_again():
    async def scenario() -> tuple[list, list, list, float]:
        loop = asyncio.get_running_loop()
        spy = _SelectTimeouts(loop)
        busy = True
        keep = KeepAwake(0.05, busy=lambda: busy)
        seconds_before = metrics.BUSY_POLL_SECONDS._value.get()
        keep.touch()
        await asyncio.sleep(0.03)
        while_busy = list(spy.timeouts)
        spy.timeouts.clear()
        busy = False
        keep.touch()
        while keep._task is not None:
            await asyncio.sleep(0)
        in_window = list(spy.timeouts)
        spy.timeouts.clear()
        await asyncio.sleep(0.05)  # one timer: the loop sleeps in a single poll
        after = list(spy.timeouts)
        return while_busy, in_window, after, metrics.BUSY_POLL_SECONDS._value.get() - seconds_before

    while_busy, in_window, after, counted = asyncio.run(scenario())
    # A sleeping loop polls with a timeout above zero; a spinning one polls hundreds of times with none.
    assert len(while_busy) > 100 and sum(1 for t in while_busy if t != 0) <= 2
    assert len(in_window) > 100 and sum(1 for t in in_window if t != 0) <= 2
    assert len(after) <= 3 and any(t is not None and t > 0.01 for t in after)
    assert counted >= 0.075  # the busy stretch and the window after it


def test_the_loop_sleeps_instead_of_spinning_while_thread_work_is_in_flight():
    async def scenario() -> list:
        loop = asyncio.get_running_loop()
        release = threading.Event()
        pool = CountedPool(1)
        job = loop.run_in_executor(pool, release.wait)
        spy = _SelectTimeouts(loop)
        keep = KeepAwake(10.0, busy=lambda: True)
        keep.touch()
        await asyncio.sleep(0.05)
        seen = list(spy.timeouts)
        release.set()
        await job
        await keep.stop()
        pool.shutdown()
        return seen

    seen = asyncio.run(scenario())
    # About two polls per pause, not hundreds without a timeout: one sleeping up to PAUSE_S, then one
    # without a timeout that runs the woken task (so a little under half wait; 43 of 88 on a loaded run).
    assert 5 <= len(seen) <= 0.05 / PAUSE_S * 2 + 5
    assert sum(1 for t in seen if t is not None and t > 0) >= len(seen) // 3


def test_no_window_means_no_task():
    async def scenario() -> bool:
        keep = KeepAwake(0.0, busy=lambda: True)
        keep.touch()
        return keep._task is None

    assert asyncio.run(scenario())


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc")
def test_a_busy_polling_frontend_answers_as_a_sleeping_one_and_goes_idle_after_its_window(cluster):
    process, url = cluster.extra_frontend(["--busy-poll-us", "100000"])
    body = {"input": ["the first text", "a second, longer text for the batch"], "model": "m"}
    reference = httpx.post(cluster.url + "/v1/embeddings", json=body, timeout=30).json()
    for _ in range(5):
        answer = httpx.post(url + "/v1/embeddings", json=body, timeout=30)
        assert answer.status_code == 200
        for got, want in zip(answer.json()["data"], reference["data"]):
            np.testing.assert_allclose(got["embedding"], want["embedding"], atol=1e-6)
    time.sleep(0.5)  # past the 100-ms window: the spin has ended and is counted
    spun = [line for line in httpx.get(url + "/metrics", timeout=10).text.splitlines()
            if line.startswith("quiver_frontend_busy_poll_seconds_total")]
    assert spun and float(spun[0].split()[-1]) >= 0.1
    start = _cpu_seconds(process.popen.pid)
    time.sleep(2.0)
    assert _cpu_seconds(process.popen.pid) - start < 0.4  # idle: no spinning (two heartbeats, the metrics)
