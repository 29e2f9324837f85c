"""Closed-loop load: N clients, each sending its next request as soon as its last one is answered.

Every request is timed on the client with time.perf_counter (wall time, transfer included). One
client is the sequential latency case; several clients sharing one iterator of calls pull work from
a common queue, as a bulk indexing job does.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np

from quiver.bench.targets import Call


@dataclass
class Measurement:
    latencies_ms: list[float]
    wall_s: float

    @property
    def requests(self) -> int:
        return len(self.latencies_ms)


def percentiles(samples_ms: Sequence[float]) -> dict[str, float]:
    values = np.asarray(samples_ms, dtype=np.float64)
    return {
        "p50": round(float(np.percentile(values, 50)), 3),
        "p90": round(float(np.percentile(values, 90)), 3),
        "p99": round(float(np.percentile(values, 99)), 3),
        "max": round(float(values.max()), 3),
        "mean": round(float(values.mean()), 3),
        "n": int(values.size),
    }


async def _client(calls: Iterable[Call], samples: list[float], progress: Any, stop_at: float | None) -> None:
    """Send calls one after another; check the clock before taking the next one, so that with a
    shared iterator every call taken is also sent (and the calls sent are the first ones)."""
    pending = iter(calls)
    sent = 0
    while not (sent and stop_at is not None and time.perf_counter() > stop_at):
        call = next(pending, None)
        if call is None:
            return
        start = time.perf_counter()
        await call()
        samples.append((time.perf_counter() - start) * 1e3)
        sent += 1
        if progress is not None:
            progress.update(1)


async def drive(
    clients: Sequence[Iterable[Call]],
    warmup: Sequence[Sequence[Call]] = (),
    progress: Any = None,
    time_limit_s: float | None = None,
) -> Measurement:
    """Run each client's warm-up calls (concurrently, untimed), then all clients together, timed.

    Clients given the same iterator share its calls (a work queue); clients given lists each send
    their whole list.

    With time_limit_s, a client sends no new request once that many seconds have passed (each client
    still sends at least one), which bounds slow in-process baselines.
    """
    if warmup:
        await asyncio.gather(*(_client(calls, [], progress, None) for calls in warmup))
    samples: list[float] = []
    start = time.perf_counter()
    stop_at = start + time_limit_s if time_limit_s else None
    await asyncio.gather(*(_client(calls, samples, progress, stop_at) for calls in clients))
    return Measurement(samples, time.perf_counter() - start)
