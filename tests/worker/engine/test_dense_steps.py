"""The dense-step thread's bookkeeping, on the CPU with a real thread: set-ups run off the caller's thread,
once per shape and up to a bound; a shape is ready only once set up and while no set-up is under way; steps
run on the same thread as the set-ups, and their exceptions reach the caller."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from quiver.worker.engine.buckets import StepShape
from quiver.worker.engine.dense_steps import DenseStepThread


def _dense(rows: int, length: int = 532) -> StepShape:
    return StepShape(num_seqs=rows, num_tokens=rows * length, max_seqlen=length, dense_len=length, graphable=False)


class _SetUps:
    """A set-up that records its thread and shape, and waits for `release` before it returns."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls: list[tuple[StepShape, bool, str]] = []

    def __call__(self, shape: StepShape, token_rows: bool) -> None:
        self.calls.append((shape, token_rows, threading.current_thread().name))
        if not self.release.wait(timeout=10):
            raise TimeoutError("never released")
        if shape.num_seqs == 13:
            raise RuntimeError("this shape cannot be set up")


def _until(condition, seconds: float = 10) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    return bool(condition())


def test_a_shape_is_ready_once_set_up_on_the_thread_and_not_while_another_set_up_is_under_way() -> None:
    set_ups = _SetUps()
    dense = DenseStepThread(torch.device("cpu"), None, set_ups)
    first, second = _dense(21), _dense(22)
    dense.set_up_later(first, token_rows=True)
    dense.set_up_later(first)  # asked for again: not set up twice
    assert _until(lambda: len(set_ups.calls) == 1) and not dense.ready(first)
    set_ups.release.set()
    assert _until(lambda: dense.ready(first))
    assert set_ups.calls == [(first, True, "quiver-dense-steps")]
    assert dense.run(threading.current_thread).name == "quiver-dense-steps"
    assert dense.run(torch.is_inference_mode_enabled)

    set_ups.release.clear()
    dense.set_up_later(second)
    assert not dense.ready(first)  # its step would wait behind the set-up of the second
    set_ups.release.set()
    assert _until(lambda: dense.ready(first) and dense.ready(second))


def test_a_shape_that_cannot_be_set_up_stays_unready_and_the_thread_goes_on() -> None:
    set_ups = _SetUps()
    set_ups.release.set()
    dense = DenseStepThread(torch.device("cpu"), None, set_ups)
    failing, working = _dense(13), _dense(14)
    dense.set_up_later(failing)
    dense.set_up_later(working)
    assert _until(lambda: dense.ready(working))
    assert not dense.ready(failing)
    with pytest.raises(ZeroDivisionError):
        dense.run(lambda: 1 / 0)
    assert dense.run(lambda: 7) == 7


def test_set_ups_stop_at_the_bound() -> None:
    set_ups = _SetUps()
    set_ups.release.set()
    dense = DenseStepThread(torch.device("cpu"), None, set_ups, max_shapes=2)
    for rows in (2, 3, 4):
        dense.set_up_later(_dense(rows))
    assert _until(lambda: dense.ready(_dense(2)) and dense.ready(_dense(3)))
    assert not dense.ready(_dense(4)) and len(set_ups.calls) == 2
