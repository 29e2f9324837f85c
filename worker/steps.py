"""What the scheduler works with: where chunks come from (Inbox), the engine as it is driven (StepEngine,
StepResult), a chunk's progress through steps (ChunkJob), one of its rows in a step (SequenceRef) and a
launched step (InFlightBatch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from quiver.common.protocol import PER_TOKEN_TASKS, PRIORITY_ONLINE, Cancel, Chunk
from quiver.worker.engine.batch import Batch


class Inbox(Protocol):
    """Where chunks and cancels come from, as queue.SimpleQueue gives them (get and get_nowait raise
    queue.Empty): a queue the worker's link thread fills, or the InlineLink polling the socket itself."""

    def get(self, block: bool = True, timeout: float | None = None) -> Chunk | Cancel: ...

    def get_nowait(self) -> Chunk | Cancel: ...

    def empty(self) -> bool: ...


def is_out_of_memory(exc: BaseException) -> bool:
    """torch.cuda.OutOfMemoryError (or an injected stand-in), recognised without importing torch."""
    return "OutOfMemoryError" in type(exc).__name__ or "out of memory" in str(exc).lower()


class StepResult(Protocol):
    """What engine.step returns (a LazyTensor on a GPU): rows once the step is done, then released."""

    def wait(self, copy: bool = True, while_pending: Callable[[], None] | None = None) -> np.ndarray: ...

    def release(self) -> None: ...


@runtime_checkable
class StepEngine(Protocol):
    """The engine as the scheduler uses it: info.model (a ModelInfo: kind, tasks, vocabulary, length limit, token types),
    info.output_dim, info.device (its type sizes background steps), and step(), which launches one batch and
    returns at once on a GPU."""

    info: Any

    def step(self, batch: Batch) -> StepResult: ...


@dataclass(eq=False)
class ChunkJob:
    chunk: Chunk  # its rows are chunk.ids (common.ragged), validated on intake
    received: float
    deadline: float
    rows_left: int  # rows whose results have not come back
    next_row: int = 0  # the first row not yet taken into a step
    values: np.ndarray | None = None
    started: float | None = None
    inference_s: float = 0.0
    closed: bool = False  # answered, failed or cancelled: its remaining sequences are skipped
    steps: int = 0  # steps that ran some of its sequences
    # Read of every waiting job in every plan, so set once: whether it is bulk work, and what a step of its
    # rows gives: pooled rows (""), or its task's kind of token rows.
    background: bool = field(init=False)
    row_kind: str = field(init=False)

    def __post_init__(self) -> None:
        self.background = self.chunk.priority != PRIORITY_ONLINE
        self.row_kind = self.chunk.task if self.chunk.task in PER_TOKEN_TASKS else ""


@dataclass(eq=False)
class SequenceRef:
    job: ChunkJob
    row: int

    @property
    def length(self) -> int:
        return int(self.job.chunk.seq_lens[self.row])


@dataclass
class InFlightBatch:
    lazy: StepResult
    refs: list[SequenceRef]
    launched: float
    device_s: float = 0.0  # how long the device ran it: from the later of its launch and the step before's end
