"""Fault injection for reliability tests: make a real worker fail the way hardware and models do.

Set QUIVER_INJECT_FAULTS on a worker process to a comma-separated list of:
    raise_on_step=N       the Nth forward pass raises RuntimeError
    hang_on_step=N        the Nth forward pass never returns (a hung kernel)
    oom_over_tokens=N     every forward pass over N tokens raises an out-of-memory error
    step_ms=N             every forward pass's rows are ready N ms after the device would start it (after
                          the pass before it), not at once: a GPU's asynchronous steps, on a CPU
Unset (the default), the engine is used as it is. Tests use this; production never sets it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from quiver.worker.engine import Batch

log = logging.getLogger("quiver.worker.faults")

FAULTS_ENV = "QUIVER_INJECT_FAULTS"


class InjectedOutOfMemoryError(RuntimeError):
    """Stands for torch.cuda.OutOfMemoryError on machines without a GPU; the scheduler treats both alike."""


def parse_faults(text: str) -> dict[str, int]:
    faults = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in ("raise_on_step", "hang_on_step", "oom_over_tokens", "step_ms") or not value.isdigit():
            raise ValueError(f"{FAULTS_ENV}: cannot read {part!r}")
        faults[name] = int(value)
    return faults


@dataclass
class DelayedResult:
    """A step's result that is ready at `ready_at` (time.monotonic()), as a GPU step's LazyTensor is once
    its event completes: wait() polls the clock, calling `while_pending` between polls when given."""

    result: Any
    ready_at: float

    def wait(self, copy: bool = True, while_pending: Callable[[], None] | None = None) -> np.ndarray:
        while (left := self.ready_at - time.monotonic()) > 0:
            if while_pending is None:
                time.sleep(left)
            else:
                while_pending()
        return self.result.wait(copy=copy)

    def release(self) -> None:
        self.result.release()


class FaultyEngine:
    """The engine, with the faults of QUIVER_INJECT_FAULTS injected into step()."""

    def __init__(self, engine: Any, faults: dict[str, int]) -> None:
        self.engine = engine
        self.faults = faults
        self.steps = 0
        self.info = engine.info
        self.device_free_at = 0.0  # with step_ms: when the last launched step's rows are ready
        self.timeline: list[tuple[float, float]] = []  # with step_ms: (launched, ready) per step
        log.warning("injecting faults into this worker: %s", faults)

    def step(self, batch: Batch) -> Any:
        self.steps += 1
        if self.faults.get("raise_on_step") == self.steps:
            raise RuntimeError(f"injected fault on forward pass {self.steps}")
        if self.faults.get("hang_on_step") == self.steps:
            log.warning("forward pass %d hangs (injected)", self.steps)
            threading.Event().wait()
        limit = self.faults.get("oom_over_tokens")
        if limit is not None and batch.num_tokens > limit:
            raise InjectedOutOfMemoryError(f"injected out of memory: {batch.num_tokens} tokens > {limit}")
        step_ms = self.faults.get("step_ms")
        if step_ms is None:
            return self.engine.step(batch)
        launched = time.monotonic()
        result = self.engine.step(batch)
        self.device_free_at = max(launched, self.device_free_at) + step_ms / 1000
        self.timeline.append((launched, self.device_free_at))
        return DelayedResult(result, self.device_free_at)

    def stats(self) -> dict[str, Any]:
        return self.engine.stats()


def with_injected_faults(engine: Any) -> Any:
    text = os.environ.get(FAULTS_ENV, "")
    return FaultyEngine(engine, parse_faults(text)) if text else engine
