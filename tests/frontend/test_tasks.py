"""await_within: a deadline on an await in the caller's own task (no task of its own), on Python 3.10 too."""

from __future__ import annotations

import asyncio

import pytest

from quiver.frontend.tasks import await_within


def test_the_result_comes_back_and_the_timer_is_gone():
    async def main():
        value = await await_within(asyncio.sleep(0.01, result="done"), 5.0)
        await asyncio.sleep(0.02)
        return value, asyncio.current_task().cancelling() if hasattr(asyncio.Task, "cancelling") else 0

    assert asyncio.run(main()) == ("done", 0)


def test_past_the_deadline_the_await_is_cancelled_and_timeout_error_raised():
    cancelled = []

    async def slow():
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def main():
        with pytest.raises(TimeoutError):
            await await_within(slow(), 0.02)
        await asyncio.sleep(0.01)  # the task is not left cancelled: it goes on awaiting
        return asyncio.current_task().cancelling() if hasattr(asyncio.Task, "cancelling") else 0

    assert asyncio.run(main()) == 0
    assert cancelled == [True]


def test_a_cancel_from_outside_stays_a_cancel():
    async def main():
        task = asyncio.ensure_future(await_within(asyncio.sleep(10), 5.0))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
