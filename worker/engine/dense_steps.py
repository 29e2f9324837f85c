"""The thread that owns cuDNN's dense-attention plans: an engine's eager steps of rows of one length whose
attention takes cuDNN run on it, and their shapes are set up on it, off the requests' path (eager steps whose
attention builds no plan per shape run on the stepping thread: attention_select.py).

A dense step at a (rows, length) not met before first builds cuDNN's attention plan for that shape: on an
H100, 48-72 ms for XLM-R large's 16 heads at 33-35 rows of 532 tokens, against 0.3 ms a call once built
(bench/RESULTS.md, 2026-12-07, last). PyTorch keeps those plans per thread (a thread_local cache in its cuDNN
attention code), so a plan must be built on the thread that will use it; building it on the stepping thread
would hold every request behind the build. So the engine runs a dense step at a shape not yet set up here as
ragged rows padded to their token bucket (a ragged kernel, on the stepping thread) and asks this thread to
set the shape up meanwhile; once it has, such steps run here, where their plan is found. A step is handed
over only while no set-up is under way, so that it never waits behind one.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import Callable, TypeVar

import torch

from quiver.worker.engine.buckets import StepShape, first_sight_key

log = logging.getLogger("quiver.engine")

T = TypeVar("T")
# Dense shapes set up at most (cuDNN keeps a plan for each): traffic of ever new equal-row shapes runs padded
# to its token buckets from then on.
MAX_DENSE_SHAPES = 512


class DenseStepThread:
    """Runs set_up(shape, token_rows) for each dense shape asked for (set_up_later), and the dense steps of
    shapes set up (run), one at a time, on one thread that has the engine's device and stream (None: no
    stream, as on the CPU) current and inference mode on. Its methods are called from the stepping thread;
    the thread starts on first use."""

    def __init__(self, device: torch.device, stream: torch.cuda.Stream | None,
                 set_up: Callable[[StepShape, bool], None], max_shapes: int = MAX_DENSE_SHAPES) -> None:
        self.device = device
        self.stream = stream
        self.max_shapes = max_shapes
        self._set_up = set_up
        self._tasks: queue.SimpleQueue[tuple[Callable[[], object], Future[object] | None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._known: set[tuple[int, int, int]] = set()  # first_sight_key of every shape asked for
        self._ready: set[tuple[int, int, int]] = set()  # ... of those set up
        self._setting_up = 0  # set-ups queued or under way
        self._thread: threading.Thread | None = None

    def ready(self, shape: StepShape) -> bool:
        """Whether a step of this shape may run here now: its shape is set up and no set-up is under way."""
        with self._lock:
            return self._setting_up == 0 and first_sight_key(shape) in self._ready

    def set_up_later(self, shape: StepShape, token_rows: bool = False) -> None:
        """Queue a set-up of this shape, unless it was asked for before or MAX_DENSE_SHAPES have been."""
        key = first_sight_key(shape)
        with self._lock:
            if key in self._known or len(self._known) >= self.max_shapes:
                return
            self._known.add(key)
            self._setting_up += 1
        self._put(lambda: self._run_set_up(shape, token_rows, key), None)

    def run(self, step: Callable[[], T]) -> T:
        """step() on this thread; its result, or its exception raised here."""
        done: Future[object] = Future()
        self._put(step, done)
        return done.result()  # type: ignore[return-value]  # the Future holds what step returned

    def _run_set_up(self, shape: StepShape, token_rows: bool, key: tuple[int, int, int]) -> None:
        start = time.perf_counter()
        try:
            self._set_up(shape, token_rows)
        except Exception:  # a shape that cannot be set up keeps running padded
            log.warning("dense shape %s could not be set up; its steps run padded", shape, exc_info=True)
        else:
            log.info("dense shape of %d rows x %d tokens set up in %.1f ms", shape.num_seqs, shape.dense_len,
                     (time.perf_counter() - start) * 1e3)
            with self._lock:
                self._ready.add(key)
        finally:
            with self._lock:
                self._setting_up -= 1

    def _put(self, task: Callable[[], object], done: Future[object] | None) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="quiver-dense-steps", daemon=True)
            self._thread.start()
        self._tasks.put((task, done))

    def _loop(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        on_stream = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        with torch.inference_mode(), on_stream:
            while True:
                task, done = self._tasks.get()
                if done is None:
                    task()
                    continue
                try:
                    done.set_result(task())
                except BaseException as exc:  # noqa: BLE001 - handed to the waiting stepping thread
                    done.set_exception(exc)
