"""Awaiting in the request's own task, with a deadline or a cancel from outside, on Python 3.10 too.

A request's work runs in the task uvicorn gives the request, not in tasks of its own: each extra task is
one more turn of the event loop between a result arriving and the answer leaving. asyncio.timeout and
Task.uncancel do this on Python 3.11+; these helpers do the same where they are missing.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, TypeVar

T = TypeVar("T")


def uncancel(task: asyncio.Task) -> None:
    """Take back one cancel() of `task` once its CancelledError has been turned into another exception
    (Python 3.11+ counts cancels; 3.10 has nothing to take back)."""
    take_back = getattr(task, "uncancel", None)
    if take_back is not None:
        take_back()


async def await_within(awaitable: Awaitable[T], timeout_s: float) -> T:
    """`await awaitable` in the current task; TimeoutError (and the awaitable cancelled) after timeout_s."""
    task = asyncio.current_task()
    assert task is not None
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    timer = asyncio.get_running_loop().call_later(timeout_s, expire)
    try:
        return await awaitable
    except asyncio.CancelledError:
        if not expired:
            raise
        uncancel(task)
        raise TimeoutError from None
    finally:
        timer.cancel()
