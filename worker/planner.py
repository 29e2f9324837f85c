"""Which waiting rows go into the next step: first come, first served under a token budget, shaped for the tail.

Chunks arrive whole and wait in arrival order. Each step takes sequences in queue order up to the token
budget and the sequence cap (a single sequence longer than the budget runs alone). A chunk that still has
sequences left after a step goes to the back of the queue (round robin), so a request arriving while a
long one is being worked through is held by at most one step of it, and the long one is never starved.

A step's length is what a request arriving during it waits for. One chunk may fill a step up to the
budget on its own (its rows need that time anyway), but online rows of several chunks share a step only
up to `shared_step_tokens`: 16 clients each sending one 512-token text made steps of all 16 (8,192
tokens, ~19 ms on an H200) and a p99 of 51-59 ms; at 4,096 tokens (~10 ms, 0.92 of the full step's
throughput) the p99 was 34-39 ms and the p50 no worse (bench/RESULTS.md, 2026-12-02).

Priority: a step with online rows takes no background rows (bulk jobs), so that an online request never
shares its step with bulk work; background rows run in steps of their own, when no online row waits.
While online work has been seen in the last ONLINE_RECENT_S, such a step takes at most
`background_step_tokens` of background rows (at least one sequence, so a bulk job always moves): an
online request that arrives while it runs waits for that short step only. Without recent online work,
background rows take up to `quiet_background_step_tokens`: on an H200 (bench/step_size.py) 8,192 tokens
of mixed lengths run at 0.97 of the throughput of a full 16,384-token step, 4,096 at 0.92 and 512 at
0.42, while the first online request after a quiet spell waits for at most one such step (about 19 ms
there). So that online traffic that never pauses cannot starve a bulk job, background rows that have
waited BACKGROUND_MAX_WAIT_S join the next step, online rows or not, with their short share.

The planner holds no engine and sends nothing: the Scheduler (scheduler.py) gives it validated chunks,
launches what it plans and answers the chunks; a chunk whose deadline passes while it waits is dropped
and handed back to the Scheduler through `expire`, to be answered with an error.
"""

from __future__ import annotations

import collections
import itertools
import time
from typing import Callable

import numpy as np

from quiver.common.protocol import TASK_LEXICAL
from quiver.worker.engine.batch import Batch
from quiver.worker.steps import ChunkJob, SequenceRef

ONLINE_RECENT_S = 2.0  # background rows stay in short steps this long after online work was last seen
# Background tokens in a step while online work is about, and without it, by device type: on a GPU a
# short step costs little more than the smallest step; a CPU's step time grows with every token, and its
# throughput barely with the step's size.
DEFAULT_BACKGROUND_STEP_TOKENS = {"cuda": 512, "cpu": 64}
DEFAULT_QUIET_BACKGROUND_STEP_TOKENS = {"cuda": 8192, "cpu": 512}
# Online tokens of a step shared by several chunks, by device type (0: the whole budget, as on a CPU,
# whose throughput barely depends on a step's size and whose steps a shorter cap would not shorten much).
DEFAULT_SHARED_STEP_TOKENS = {"cuda": 4096, "cpu": 0}
BACKGROUND_MAX_WAIT_S = 0.25  # background rows kept out of online steps this long at most


class StepPlanner:
    """The waiting chunks, in arrival order, and the plan of each step from them."""

    def __init__(self, max_batch_tokens: int, max_batch_seqs: int, device_type: str,
                 expire: Callable[[ChunkJob], None], background_step_tokens: int = 0,
                 quiet_background_step_tokens: int = 0, shared_step_tokens: int = 0,
                 clock: Callable[[], float] | None = None) -> None:
        self.clock = clock or time.monotonic  # or a simulation's clock (bench/sched_sim.py)
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_seqs = max_batch_seqs
        self.expire = expire  # answers a job whose deadline passed while it waited (the planner drops it)
        self.background_step_tokens = background_step_tokens or DEFAULT_BACKGROUND_STEP_TOKENS.get(device_type, 64)
        self.quiet_background_step_tokens = (quiet_background_step_tokens
                                             or DEFAULT_QUIET_BACKGROUND_STEP_TOKENS.get(device_type, 512))
        self.shared_step_tokens = (shared_step_tokens or DEFAULT_SHARED_STEP_TOKENS.get(device_type, 0)
                                   or max_batch_tokens)
        self.online_seen = float("-inf")  # when an online chunk last arrived or waited
        # When the waiting background rows last moved: into a step, or into a queue that held none (add).
        self.background_moved = self.clock()
        self.waiting: collections.deque[ChunkJob] = collections.deque()  # jobs with rows not yet taken
        self.waiting_seqs = 0
        self.waiting_tokens = 0  # their rows' tokens (cancelled chunks' included until the next plan)

    def add(self, job: ChunkJob, now: float) -> None:
        """A validated chunk joins the queue."""
        if not job.background:
            self.online_seen = now
        elif not any(waiting.background and not waiting.closed for waiting in self.waiting):
            self.background_moved = now  # the first to wait: background work waits from now
        self.waiting.append(job)
        self.waiting_seqs += job.chunk.num_seqs
        self.waiting_tokens += job.chunk.num_tokens

    def next_batch(self, closed_only: bool = False) -> tuple[Batch, list[SequenceRef]] | None:
        """Take sequences up to the budgets in queue order, online chunks first; None when nothing waits.

        closed_only: take them only if no chunk arriving later could join the step (see closed()); else
        None, and nothing is taken."""
        if not self.waiting:  # the usual case right after a step: nothing to plan
            return None
        if closed_only and not self._could_close():
            return None
        now = self.clock()
        if len(self.waiting) == 1 and not closed_only:
            whole = self._whole_chunk(self.waiting[0], now)
            if whole is not None:
                return whole
        refs: list[SequenceRef] = []
        tokens = background_tokens = 0
        online = [job for job in self.waiting if not job.background]
        online_waits = any(not job.closed for job in online)
        if online_waits:
            self.online_seen = now
        if online_waits and now - self.background_moved < BACKGROUND_MAX_WAIT_S:
            background_cap = 0  # this step is online work's alone
        elif now - self.online_seen < ONLINE_RECENT_S:
            background_cap = self.background_step_tokens
        else:
            background_cap = self.quiet_background_step_tokens
        full = False
        row_kind: str | None = None  # a step gives pooled rows or one kind of token rows, not a mix
        for job in itertools.chain(online, (job for job in self.waiting if job.background)):  # arrival order
            if full:
                break
            job_row_kind, background = job.row_kind, job.background
            if job.closed or (row_kind is not None and job_row_kind != row_kind):
                continue
            if job.deadline < now:
                job.closed = True  # dropped from the queue below
                self.expire(job)
                continue
            for row in range(job.next_row, job.chunk.num_seqs):
                length = int(job.chunk.seq_lens[row])
                if len(refs) >= self.max_batch_seqs or (refs and tokens + length > self.max_batch_tokens):
                    full = True
                    break
                if not background and refs and refs[0].job is not job and tokens + length > self.shared_step_tokens:
                    full = True  # a step shared by several chunks' online rows stays short
                    break
                if background and (not background_cap or
                                   (background_tokens and background_tokens + length > background_cap)):
                    full = True  # only background rows are left, and their share of the step is taken
                    break
                refs.append(SequenceRef(job, row))
                row_kind = job_row_kind
                tokens += length
                background_tokens += length if background else 0
        if closed_only and not self.closed(refs, tokens):
            return None
        for ref in refs:
            ref.job.next_row = ref.row + 1
            if ref.job.started is None:
                ref.job.started = now
        # Round robin: a chunk that had rows in this step and still has more goes behind every chunk
        # waiting now, so it holds later arrivals for one step at most and is itself never passed over
        # for more than the chunks that arrived before its turn came round.
        taken = {id(ref.job) for ref in refs}
        left = [job for job in self.waiting if not job.closed and job.next_row < job.chunk.num_seqs]
        self.waiting = collections.deque(
            [job for job in left if id(job) not in taken] + [job for job in left if id(job) in taken])
        self.waiting_seqs = sum(job.chunk.num_seqs - job.next_row for job in self.waiting)
        self.waiting_tokens = sum(job.chunk.num_tokens - (int(job.chunk.ids.offsets[job.next_row]) if job.next_row else 0)
                                  for job in self.waiting)
        if not refs:
            return None
        if background_tokens:
            self.background_moved = now
        return self.assemble(refs), refs

    def _whole_chunk(self, job: ChunkJob, now: float) -> tuple[Batch, list[SequenceRef]] | None:
        """The step of a lone online chunk that waits whole and fits the budgets (a batch-1 request), as
        the general plan below would make it, planned without its passes; None for anything else."""
        chunk = job.chunk
        if (job.next_row or job.closed or job.background or job.deadline < now
                or chunk.num_seqs > self.max_batch_seqs
                or (chunk.num_tokens > self.max_batch_tokens and chunk.num_seqs > 1)):
            return None
        self.online_seen = now
        job.next_row = chunk.num_seqs
        if job.started is None:
            job.started = now
        self.waiting.clear()
        self.waiting_seqs = self.waiting_tokens = 0
        refs = [SequenceRef(job, row) for row in range(chunk.num_seqs)]
        return self.assemble(refs), refs

    def _could_close(self) -> bool:
        """Whether what waits could make a closed step: a step holds at most the waiting rows and tokens.
        While a step runs, each arrival asks for a closed step; below these bounds the answer costs no plan
        (a plan walks every waiting row: 0.1-0.3 ms for 64-256 short chunks on a 2-core VM, bench/plan_cost.py)."""
        return (self.waiting_seqs >= self.max_batch_seqs
                or self.waiting_tokens >= min(self.shared_step_tokens, self.max_batch_tokens))

    def closed(self, refs: list[SequenceRef], tokens: int) -> bool:
        """Whether no online chunk arriving later could add a row to this step: it holds online rows and
        reached the sequence cap, or the token budget or the cap of a step shared by several chunks (a
        later chunk's row would share it). A step of background rows alone is never closed: an online
        arrival goes before them."""
        return (any(not ref.job.background for ref in refs) and
                (len(refs) >= self.max_batch_seqs or tokens >= min(self.shared_step_tokens, self.max_batch_tokens)))

    @staticmethod
    def assemble(refs: list[SequenceRef]) -> Batch:
        return Batch.gather([(ref.job.chunk.ids, ref.row) for ref in refs],
                            normalize=np.fromiter((ref.job.chunk.normalize for ref in refs), dtype=bool, count=len(refs)),
                            token_rows=bool(refs[0].job.row_kind), lexical_only=refs[0].job.row_kind == TASK_LEXICAL)
