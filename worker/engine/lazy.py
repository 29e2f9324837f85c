"""Results on their way to the host: pinned output slots and the LazyTensor handed to the caller.

On the GPU, step() ends with an asynchronous copy of the result rows into one of two page-locked host
slots and a CUDA event; the caller gets a LazyTensor at once. wait() blocks on the event. A slot goes
back to the pool only when its LazyTensor is released (or garbage collected), so a result is never
overwritten while someone may still read it; a step that finds no free slot raises SlotsBusyError.
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np
import torch


class SlotsBusyError(RuntimeError):
    """Every pinned output slot is held by an unreleased LazyTensor."""


class HostSlots:
    """A fixed set of page-locked float32 buffers [rows, cols], handed out one per step."""

    def __init__(self, num_slots: int, rows: int, cols: int, pinned: bool = True) -> None:
        self.buffers = [torch.empty(rows, cols, dtype=torch.float32, pin_memory=pinned) for _ in range(num_slots)]
        self._free = list(range(num_slots))
        self._lock = threading.Lock()

    def acquire(self) -> int:
        with self._lock:
            if not self._free:
                raise SlotsBusyError(
                    f"all {len(self.buffers)} pinned result slots are held: release() the LazyTensor of an "
                    "earlier step before launching another"
                )
            return self._free.pop(0)

    def release(self, slot: int) -> None:
        with self._lock:
            if slot not in self._free:
                self._free.append(slot)

    @property
    def free(self) -> int:
        with self._lock:
            return len(self._free)


class LazyTensor:
    """The float32 result [num_seqs, output_dim] of one step, possibly still being computed."""

    def __init__(
        self,
        rows: np.ndarray,
        event: torch.cuda.Event | None = None,
        slots: HostSlots | None = None,
        slot: int = -1,
    ) -> None:
        self._rows = rows
        self._event = event
        self._slots = slots
        self._slot = slot
        self._released = False

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._rows.shape)

    def wait(self, copy: bool = True, while_pending: Callable[[], None] | None = None) -> np.ndarray:
        """Block until the result is in host memory and return it.

        With copy=True (the default) the array is the caller's own. With copy=False it is a view of the
        pinned slot, valid only until release(). With `while_pending`, the event is polled and that is
        called between polls (where CUDA's own wait would spin without ever giving up the CPU).
        """
        if self._released:
            raise RuntimeError("wait() on a LazyTensor that was already released")
        if self._event is not None:
            if while_pending is not None:
                while not self._event.query():
                    while_pending()
            self._event.synchronize()
        return self._rows.copy() if copy and self._slots is not None else self._rows

    def release(self) -> None:
        """The caller is done reading; the pinned slot may be reused. Safe to call twice."""
        if not self._released:
            self._released = True
            if self._slots is not None:
                self._slots.release(self._slot)

    def __del__(self) -> None:
        # A dropped result frees its slot: later copies into it are ordered after this one on the stream.
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
