"""Busy polling for the frontend: the event loop kept awake for a moment around traffic.

While a request's chunks are with the broker, and for a short window after the last result (when a
client sending one request at a time sends its next), the loop would otherwise sleep in epoll and the
kernel would have to wake it when the result or the next request lands, tens to hundreds of
microseconds on a virtualised host. While the window is open a task yields at every turn of the loop, so
the loop polls its descriptors without sleeping and sees a message as soon as it lands. This is the
frontend's side of the broker's and the workers' `busy_poll_us`. While it spins, the loop's thread holds its
CPU with the ZeroMQ context's I/O threads (`core`, common/wakeups.py) and gives it to them at every turn.

A spinning loop holds the GIL except for the moment of each poll, which a thread waiting for the GIL
rarely wins: a pool thread returning to Python would then wait up to the interpreter's switch interval
(5 ms). So every thread pool of the frontend process is a CountedPool (the loop's default executor, used
by asyncio.to_thread, included), and while any of them holds work the task sleeps instead of spinning.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from quiver.common.wakeups import SpinCore
from quiver.frontend import metrics

# How long the task sleeps at a time while thread work is in flight: the loop still wakes for any message.
PAUSE_S = 0.001


class ThreadWork:
    """How many jobs the process's thread pools hold, queued or running."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.in_flight = 0

    def add(self) -> None:
        with self._lock:
            self.in_flight += 1

    def done(self, _future: object = None) -> None:
        with self._lock:
            self.in_flight -= 1


THREAD_WORK = ThreadWork()


class CountedPool(ThreadPoolExecutor):
    """A thread pool whose jobs count in THREAD_WORK from submission until they finish or are cancelled."""

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        THREAD_WORK.add()
        try:
            future = super().submit(fn, *args, **kwargs)
        except BaseException:
            THREAD_WORK.done()
            raise
        future.add_done_callback(THREAD_WORK.done)
        return future


class KeepAwake:
    """Keeps the running loop from sleeping while `busy()` holds and for `window_s` after the last `touch()`."""

    def __init__(self, window_s: float, busy: Callable[[], bool], work: ThreadWork = THREAD_WORK) -> None:
        self.window_s = window_s
        self._busy = busy
        self._work = work
        self._until = 0.0
        self._task: asyncio.Task | None = None
        self.core: SpinCore | None = None  # set once the broker link's context exists

    def touch(self) -> None:
        """Traffic now: open the window, or hold it open `window_s` longer."""
        if self.window_s <= 0:
            return
        self._until = time.monotonic() + self.window_s
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._spin())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _spin(self) -> None:
        started = time.monotonic()
        core = self.core
        if core is not None:
            core.hold()
        try:
            while self._busy() or time.monotonic() < self._until:
                if self._work.in_flight:
                    await asyncio.sleep(PAUSE_S)
                else:
                    await asyncio.sleep(0)
                    if core is not None:
                        core.spin_turn()
        finally:
            if core is not None:
                core.release()
            self._task = None
            metrics.BUSY_POLL_SECONDS.inc(time.monotonic() - started)
