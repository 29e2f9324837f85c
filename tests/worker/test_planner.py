"""The step planner alone, without an engine: which waiting rows each step takes (arrival order, budgets,
round robin, the shared cap, online work before bulk work, deadlines) and when a step is closed."""

from __future__ import annotations

import time

import numpy as np
import pytest

from quiver.common.protocol import PRIORITY_BACKGROUND, Chunk
from quiver.worker.planner import BACKGROUND_MAX_WAIT_S, ONLINE_RECENT_S, StepPlanner
from quiver.worker.steps import ChunkJob


def _job(chunk_id: str, lens: list[int], background: bool = False, timeout_s: float = 30.0) -> ChunkJob:
    chunk = Chunk(chunk_id=chunk_id, task="embed", num_seqs=len(lens), num_tokens=sum(lens), normalize=True,
                  timeout_s=timeout_s, input_ids=np.arange(1, sum(lens) + 1, dtype=np.int32),
                  seq_lens=np.array(lens, dtype=np.int32))
    if background:
        chunk.priority = PRIORITY_BACKGROUND
    now = time.monotonic()
    return ChunkJob(chunk=chunk, received=now, deadline=now + timeout_s, rows_left=len(lens))


def _planner(tokens: int = 256, seqs: int = 16, expired: list[ChunkJob] | None = None, **caps: int) -> StepPlanner:
    return StepPlanner(tokens, seqs, "cuda", expire=(expired if expired is not None else []).append, **caps)


def _add(planner: StepPlanner, *jobs: ChunkJob) -> None:
    for job in jobs:
        planner.add(job, time.monotonic())


def _step(planner: StepPlanner, closed_only: bool = False) -> list[tuple[str, int]] | None:
    picked = planner.next_batch(closed_only)
    if picked is None:
        return None
    batch, refs = picked
    assert batch.seq_lens.tolist() == [ref.length for ref in refs]  # the batch holds exactly the planned rows
    return [(ref.job.chunk.chunk_id, ref.row) for ref in refs]


def test_rows_go_in_arrival_order_up_to_the_budget_and_cap_and_a_chunk_with_rows_left_goes_last() -> None:
    planner = _planner(tokens=100, seqs=3)
    _add(planner, _job("a", [40, 40, 40]), _job("b", [10, 10, 10, 10]))
    assert _step(planner) == [("a", 0), ("a", 1)]  # a third 40 would pass 100 tokens
    assert _step(planner) == [("b", 0), ("b", 1), ("b", 2)]  # the sequence cap
    assert _step(planner) == [("a", 2), ("b", 3)]
    assert _step(planner) is None and planner.waiting_seqs == planner.waiting_tokens == 0


def test_a_lone_sequence_longer_than_the_budget_runs_alone() -> None:
    planner = _planner(tokens=50)
    _add(planner, _job("long", [120, 5]))
    assert _step(planner) == [("long", 0)]
    assert _step(planner) == [("long", 1)]


def test_one_chunk_fills_the_budget_but_several_chunks_share_a_step_up_to_the_shared_cap() -> None:
    planner = _planner(tokens=256, shared_step_tokens=64)
    _add(planner, _job("one", [32, 32, 32, 32]))
    assert _step(planner) == [("one", 0), ("one", 1), ("one", 2), ("one", 3)]  # 128 tokens, one chunk's
    _add(planner, _job("b", [40]), _job("c", [40]), _job("d", [20]))
    assert _step(planner) == [("b", 0)]  # c would take the shared step to 80 tokens
    assert _step(planner) == [("c", 0), ("d", 0)]  # 60


def test_a_closed_only_plan_takes_a_step_only_when_no_later_arrival_could_join_it() -> None:
    planner = _planner(tokens=256, seqs=8, shared_step_tokens=64)
    _add(planner, _job("a", [32]))
    assert _step(planner, closed_only=True) is None and planner.waiting_seqs == 1  # nothing was taken
    _add(planner, _job("b", [32]), _job("c", [32]))
    assert _step(planner, closed_only=True) == [("a", 0), ("b", 0)]  # at the shared cap: closed
    assert _step(planner, closed_only=True) is None  # c alone could still be joined
    assert _step(planner) == [("c", 0)]


def test_a_chunk_past_its_deadline_is_handed_back_and_never_planned() -> None:
    expired: list[ChunkJob] = []
    planner = _planner(expired=expired)
    late, on_time = _job("late", [10], timeout_s=-1.0), _job("on-time", [10, 10])
    _add(planner, late, on_time)
    assert _step(planner) == [("on-time", 0), ("on-time", 1)]
    assert expired == [late] and late.closed
    assert _step(planner) is None and not planner.waiting


def test_online_rows_go_first_and_background_rows_get_a_short_step_while_online_work_is_about() -> None:
    planner = _planner(tokens=256, background_step_tokens=20, quiet_background_step_tokens=100)
    _add(planner, _job("bulk", [10, 10, 10, 10], background=True), _job("online", [10]))
    assert _step(planner) == [("online", 0)]  # no background row shares an online step
    assert _step(planner) == [("bulk", 0), ("bulk", 1)]  # online work was just seen: 20 tokens
    planner.online_seen -= ONLINE_RECENT_S
    assert _step(planner) == [("bulk", 2), ("bulk", 3)]  # quiet: up to 100


def test_background_rows_that_waited_long_enough_join_an_online_step() -> None:
    planner = _planner(tokens=256, background_step_tokens=10)
    _add(planner, _job("bulk", [10, 10], background=True), _job("online", [10]))
    planner.background_moved -= BACKGROUND_MAX_WAIT_S
    assert _step(planner) == [("online", 0), ("bulk", 0)]  # with their short share


def test_a_background_chunk_waits_from_its_arrival() -> None:
    planner = _planner()
    _add(planner, _job("online", [10]))
    before = time.monotonic()
    _add(planner, _job("bulk", [10], background=True))
    assert planner.background_moved >= before  # not from the planner's creation
    first = planner.background_moved
    _add(planner, _job("bulk-2", [10], background=True))
    assert planner.background_moved == first  # background work already waited


@pytest.mark.parametrize("lens", [[5], [300], [5, 5, 5]])
def test_a_lone_whole_chunk_comes_whole_from_the_shortcut(lens: list[int]) -> None:
    planner = _planner(tokens=256)
    job = _job("lone", lens)
    _add(planner, job)
    picked = planner.next_batch()
    assert picked is not None
    batch, refs = picked
    assert [ref.row for ref in refs] == list(range(len(lens))) and batch.input_ids.tolist() == job.chunk.input_ids.tolist()
    assert job.next_row == len(lens) and job.started is not None and not planner.waiting
