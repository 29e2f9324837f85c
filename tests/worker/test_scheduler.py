"""The scheduler on its own, driving the real engine on CPU (the packaged all-MiniLM-L6-v2): token budget,
arrival order, deadlines, cancels, halving retries after a failed step, and the serving loop."""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
import pytest

from quiver.common.model_info import default_model_dir
from quiver.common.protocol import PRIORITY_BACKGROUND, Cancel, Chunk, Error, Message, Result
from quiver.worker.engine import Batch, Engine, load_engine
from quiver.worker.faults import FaultyEngine
from quiver.worker.planner import BACKGROUND_MAX_WAIT_S, ONLINE_RECENT_S
from quiver.worker.scheduler import Scheduler
from quiver.worker.steps import StepEngine


@pytest.fixture(scope="module")
def engine() -> Engine:
    return load_engine(default_model_dir(), device="cpu")


def _chunk(chunk_id: str, lens: list[int], seed: int = 0, timeout_s: float = 30.0) -> Chunk:
    rng = np.random.default_rng(seed)
    return Chunk(chunk_id=chunk_id, task="embed", num_seqs=len(lens), num_tokens=sum(lens), normalize=True,
                 timeout_s=timeout_s, input_ids=rng.integers(1000, 20000, size=sum(lens), dtype=np.int32),
                 seq_lens=np.array(lens, dtype=np.int32))


def _expected(engine: Engine, chunk: Chunk) -> np.ndarray:
    """Each sequence run alone, straight through the engine."""
    offsets = np.concatenate([[0], np.cumsum(chunk.seq_lens)])
    rows = [engine.run_eager(Batch(input_ids=chunk.input_ids[offsets[i]:offsets[i + 1]],
                                   seq_lens=chunk.seq_lens[i:i + 1], normalize=np.array([True])))
            for i in range(chunk.num_seqs)]
    return np.concatenate(rows)


def _scheduler(engine: StepEngine, sent: list[Message], tokens: int = 256, seqs: int = 16) -> Scheduler:
    return Scheduler(engine, send=sent.append, worker_name="test", max_batch_tokens=tokens, max_batch_seqs=seqs)


def test_the_real_engine_satisfies_the_engine_protocol(engine: Engine) -> None:
    assert isinstance(engine, StepEngine)
    assert isinstance(FaultyEngine(engine, {}), StepEngine)


def test_a_step_takes_sequences_in_order_up_to_the_token_budget_and_the_sequence_cap(engine: Engine) -> None:
    sent: list[Message] = []
    scheduler = _scheduler(engine, sent, tokens=100, seqs=3)
    scheduler.accept(_chunk("a", [40, 40, 40]))
    scheduler.accept(_chunk("b", [10, 10, 10, 10]))
    batch, refs = scheduler.next_batch() or (None, [])
    assert batch is not None and batch.seq_lens.tolist() == [40, 40]  # a third 40 would exceed 100 tokens
    assert [(ref.job.chunk.chunk_id, ref.row) for ref in refs] == [("a", 0), ("a", 1)]
    # the rest of "a" goes behind "b" (round robin): a long request holds later ones for one step at most
    batch, refs = scheduler.next_batch() or (None, [])
    assert [(ref.job.chunk.chunk_id, ref.row) for ref in refs] == [("b", 0), ("b", 1), ("b", 2)]  # cap of 3
    batch, refs = scheduler.next_batch() or (None, [])
    assert [(ref.job.chunk.chunk_id, ref.row) for ref in refs] == [("a", 2), ("b", 3)]
    assert scheduler.next_batch() is None and scheduler.planner.waiting_seqs == 0


def test_a_sequence_longer_than_the_budget_runs_alone(engine: Engine) -> None:
    scheduler = _scheduler(engine, [], tokens=50)
    scheduler.accept(_chunk("long", [120, 5]))
    first = scheduler.next_batch()
    assert first is not None and first[0].seq_lens.tolist() == [120]
    second = scheduler.next_batch()
    assert second is not None and second[0].seq_lens.tolist() == [5]


def test_a_lone_whole_chunk_is_planned_as_the_general_plan_plans_it(engine: Engine,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """next_batch's shortcut for one waiting chunk (a batch-1 request) against the general plan, on random
    chunks, budgets, priorities, deadlines, cancels and partly taken chunks: the same step, the same state."""
    monkeypatch.setattr(time, "monotonic", lambda: 1000.0)  # both plans see the same clock
    rng = np.random.default_rng(11)
    shortcuts = 0

    def plan(use_shortcut: bool, case: dict) -> tuple:
        nonlocal shortcuts
        sent: list[Message] = []
        scheduler = _scheduler(engine, sent, tokens=case["tokens"], seqs=case["seqs"])
        whole_chunk = scheduler.planner._whole_chunk

        def counted(job, now):  # type: ignore[no-untyped-def]
            nonlocal shortcuts
            made = whole_chunk(job, now)
            shortcuts += made is not None
            return made

        scheduler.planner._whole_chunk = counted if use_shortcut else (lambda job, now: None)  # type: ignore[method-assign]
        chunk = _chunk("c", case["lens"], timeout_s=case["timeout_s"])
        chunk.priority = case["priority"]
        scheduler.accept(chunk)
        if case["taken"]:
            scheduler.planner.waiting[0].next_row = 1
        if case["cancelled"]:
            scheduler.accept(Cancel(chunk_id="c"))
        picked = scheduler.next_batch()
        step = None
        if picked is not None:
            batch, refs = picked
            step = (batch.input_ids.tolist(), batch.seq_lens.tolist(), batch.normalize.tolist(), batch.token_rows,
                    [(ref.job.chunk.chunk_id, ref.row) for ref in refs])
        job = scheduler.jobs.get("c")
        return (step, scheduler.planner.online_seen, scheduler.planner.background_moved, len(scheduler.planner.waiting),
                scheduler.planner.waiting_seqs, job and (job.next_row, job.started, job.closed),
                [(type(m).__name__, getattr(m, "code", None)) for m in sent])

    for _ in range(400):
        lens = rng.integers(1, 60, size=int(rng.integers(1, 7))).tolist()
        case = {"lens": lens, "tokens": int(rng.integers(20, 200)), "seqs": int(rng.integers(1, 8)),
                "priority": PRIORITY_BACKGROUND if rng.random() < 0.2 else 0,
                "timeout_s": -1.0 if rng.random() < 0.1 else 30.0, "cancelled": rng.random() < 0.1,
                "taken": len(lens) > 1 and rng.random() < 0.15}
        assert plan(True, case) == plan(False, case), case
    assert shortcuts > 50  # the shortcut was taken, not only declined


def test_expired_and_cancelled_chunks_never_run(engine: Engine) -> None:
    sent: list[Message] = []
    scheduler = _scheduler(engine, sent)
    scheduler.accept(_chunk("late", [8, 8], timeout_s=-1.0))
    scheduler.accept(_chunk("gone", [8]))
    scheduler.accept(Cancel(chunk_id="gone"))
    scheduler.accept(_chunk("kept", [8]))
    picked = scheduler.next_batch()
    assert picked is not None
    assert [ref.job.chunk.chunk_id for ref in picked[1]] == ["kept"]
    assert [(type(m).__name__, m.chunk_id, getattr(m, "code", None)) for m in sent] == [("Error", "late", "expired")]
    scheduler.finish(scheduler.launch(*picked))
    assert [m.chunk_id for m in sent if isinstance(m, Result)] == ["kept"] and not scheduler.jobs


def test_an_out_of_memory_step_is_retried_in_halves_and_every_row_stays_on_its_sequence(engine: Engine) -> None:
    sent: list[Message] = []
    faulty = FaultyEngine(engine, {"oom_over_tokens": 40})  # the real engine, failing above 40 tokens
    scheduler = _scheduler(faulty, sent, tokens=256)
    chunks = [_chunk("x", [12, 30, 7], seed=1), _chunk("y", [25, 3], seed=2)]
    for chunk in chunks:
        scheduler.accept(chunk)
    batch, refs = scheduler.next_batch() or (None, [])
    assert batch is not None and batch.num_tokens == 77
    with pytest.raises(RuntimeError):
        scheduler.launch(batch, refs)
    scheduler.recover(refs, RuntimeError("injected out of memory"))
    results = {m.chunk_id: m for m in sent if isinstance(m, Result)}
    assert sorted(results) == ["x", "y"] and not any(isinstance(m, Error) for m in sent)
    for chunk in chunks:
        np.testing.assert_allclose(results[chunk.chunk_id].values, _expected(engine, chunk), atol=1e-4)


def test_each_row_of_a_step_reaches_its_own_sequence_whatever_the_order_of_the_step(engine: Engine) -> None:
    """Runs of consecutive rows are copied as one slice: interleaved chunks, a gap, and rows out of
    order must still land on their own sequences."""
    sent: list[Message] = []
    scheduler = _scheduler(engine, sent, tokens=512)
    chunks = [_chunk("x", [9, 21, 5, 14], seed=3), _chunk("y", [17, 6], seed=4)]
    for chunk in chunks:
        scheduler.accept(chunk)
    _, planned = scheduler.next_batch() or (None, [])
    assert [(ref.job.chunk.chunk_id, ref.row) for ref in planned] == [("x", 0), ("x", 1), ("x", 2), ("x", 3),
                                                                     ("y", 0), ("y", 1)]
    refs = [planned[i] for i in (0, 2, 5, 1, 3, 4)]  # x0 x2 y1 x1 x3 y0
    batch = Batch.gather([(ref.job.chunk.ids, ref.row) for ref in refs], normalize=np.ones(len(refs), dtype=bool))
    scheduler.finish(scheduler.launch(batch, refs))
    results = {m.chunk_id: m for m in sent if isinstance(m, Result)}
    assert sorted(results) == ["x", "y"]
    for chunk in chunks:
        np.testing.assert_allclose(results[chunk.chunk_id].values, _expected(engine, chunk), atol=1e-4)


def test_a_step_that_keeps_failing_fails_only_its_own_chunks(engine: Engine) -> None:
    sent: list[Message] = []
    scheduler = _scheduler(FaultyEngine(engine, {"oom_over_tokens": 10}), sent)
    scheduler.accept(_chunk("too-big", [11]))
    scheduler.accept(_chunk("fits", [4]))
    batch, refs = scheduler.next_batch() or (None, [])
    scheduler.recover(refs, RuntimeError("injected out of memory"))
    outcome = {m.chunk_id: type(m).__name__ for m in sent}
    assert outcome == {"too-big": "Error", "fits": "Result"}


def test_the_loop_runs_everything_waiting_as_one_step_and_answers_each_chunk(engine: Engine) -> None:
    sent: list[Message] = []
    scheduler = _scheduler(engine, sent, tokens=512, seqs=32)
    inbox: queue.Queue = queue.Queue()
    chunks = [_chunk(f"c{i}", [int(n) for n in np.random.default_rng(i).integers(3, 40, size=i + 1)], seed=i)
              for i in range(5)]
    for chunk in chunks:
        inbox.put(chunk)
    stop, drain = threading.Event(), threading.Event()
    drain.set()  # serve what is there, then return
    loop = threading.Thread(target=scheduler.run, args=(inbox, stop, drain), daemon=True)
    loop.start()
    loop.join(timeout=120)
    assert not loop.is_alive()
    assert scheduler.steps == 1  # 15 sequences under the budget: one step, not one per chunk
    results = {m.chunk_id: m for m in sent if isinstance(m, Result)}
    assert sorted(results) == sorted(c.chunk_id for c in chunks)
    for chunk in chunks:
        np.testing.assert_allclose(results[chunk.chunk_id].values, _expected(engine, chunk), atol=1e-4)
        assert results[chunk.chunk_id].inference_s >= 0 and results[chunk.chunk_id].queue_s >= 0


def test_online_steps_take_no_background_rows_and_background_steps_stay_short_while_online_work_is_about(
        engine: Engine) -> None:
    sent: list[Message] = []
    scheduler = Scheduler(engine, send=sent.append, worker_name="test", max_batch_tokens=200, max_batch_seqs=16,
                          background_step_tokens=10, quiet_background_step_tokens=80)
    bulk = _chunk("bulk", [10] * 14, seed=1)
    bulk.priority = PRIORITY_BACKGROUND
    scheduler.accept(bulk)
    scheduler.accept(_chunk("online", [10, 10], seed=2))

    def step(online_seen_ago: float = 0.0) -> list[tuple[str, int]]:
        scheduler.planner.online_seen = time.monotonic() - online_seen_ago  # when online work was last seen, whatever the pace
        picked = scheduler.next_batch()
        assert picked is not None
        scheduler.finish(scheduler.launch(*picked))
        return [(ref.job.chunk.chunk_id, ref.row) for ref in picked[1]]

    assert step() == [("online", 0), ("online", 1)]  # online first, though it came later, and alone
    assert step() == [("bulk", 0)]  # online work was just here: background steps stay short
    assert step() == [("bulk", 1)]
    assert step() == [("bulk", 2)]
    # ... until none has been seen for a while: then a larger share, not the whole budget
    assert step(ONLINE_RECENT_S) == [("bulk", row) for row in range(3, 11)]  # 80 tokens
    assert step(ONLINE_RECENT_S) == [("bulk", row) for row in range(11, 14)]
    answers = {m.chunk_id: m for m in sent if isinstance(m, Result)}
    assert set(answers) == {"online", "bulk"}
    for chunk in (bulk, _chunk("online", [10, 10], seed=2)):
        np.testing.assert_allclose(answers[chunk.chunk_id].values, _expected(engine, chunk), atol=1e-5)


def test_background_rows_that_waited_too_long_join_an_online_step(engine: Engine) -> None:
    """Online traffic that never pauses cannot starve a bulk job: after BACKGROUND_MAX_WAIT_S it gets its
    short share of the next step beside the online rows."""
    scheduler = Scheduler(engine, send=lambda message: None, worker_name="test", max_batch_tokens=200,
                          max_batch_seqs=16, background_step_tokens=20)
    bulk = _chunk("bulk", [10] * 4, seed=1)
    bulk.priority = PRIORITY_BACKGROUND
    scheduler.accept(bulk)
    for n in range(3):
        scheduler.accept(_chunk(f"online-{n}", [10], seed=n + 2))
        picked = scheduler.next_batch()
        assert picked is not None
        assert [ref.job.chunk.chunk_id for ref in picked[1]] == [f"online-{n}"]
        scheduler.finish(scheduler.launch(*picked))
    scheduler.planner.background_moved -= BACKGROUND_MAX_WAIT_S  # the bulk chunk has waited that long
    scheduler.accept(_chunk("online-3", [10], seed=5))
    picked = scheduler.next_batch()
    assert picked is not None
    assert [(ref.job.chunk.chunk_id, ref.row) for ref in picked[1]] == [("online-3", 0), ("bulk", 0), ("bulk", 1)]
    scheduler.finish(scheduler.launch(*picked))
    scheduler.accept(_chunk("online-4", [10], seed=6))
    picked = scheduler.next_batch()
    assert picked is not None
    assert [ref.job.chunk.chunk_id for ref in picked[1]] == ["online-4"]  # it moved just now: back to waiting


def test_a_bulk_chunk_waits_from_its_arrival_not_from_the_last_background_step(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bulk chunk that arrives when no background work waits starts its wait then: after a quiet spell
    longer than BACKGROUND_MAX_WAIT_S it still stays out of the online step beside it."""
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    scheduler = Scheduler(engine, send=lambda message: None, worker_name="test", max_batch_tokens=200,
                          max_batch_seqs=16, background_step_tokens=20)
    clock[0] += 10 * BACKGROUND_MAX_WAIT_S  # no plan ran in between
    bulk = _chunk("bulk", [10] * 2, seed=1)
    bulk.priority = PRIORITY_BACKGROUND
    scheduler.accept(bulk)
    scheduler.accept(_chunk("online", [10], seed=2))
    picked = scheduler.next_batch()
    assert picked is not None and [ref.job.chunk.chunk_id for ref in picked[1]] == ["online"]


def test_a_step_shared_by_several_chunks_stays_within_the_shared_cap_while_one_chunk_may_fill_the_budget(
        engine: Engine) -> None:
    scheduler = Scheduler(engine, send=lambda message: None, worker_name="test", max_batch_tokens=200,
                          max_batch_seqs=16, shared_step_tokens=30)
    scheduler.accept(_chunk("large", [10] * 8, seed=1))
    for n in range(5):
        scheduler.accept(_chunk(f"small-{n}", [10], seed=n + 2))

    def step() -> list[str]:
        picked = scheduler.next_batch()
        assert picked is not None
        scheduler.finish(scheduler.launch(*picked))
        return [ref.job.chunk.chunk_id for ref in picked[1]]

    assert step() == ["large"] * 8  # one chunk alone: 80 tokens, within the budget of 200
    assert step() == ["small-0", "small-1", "small-2"]  # several chunks: 30 tokens at most
    assert step() == ["small-3", "small-4"]
    assert scheduler.next_batch() is None


def test_a_lexical_chunk_is_refused_by_a_model_without_bge_m3_heads(engine: Engine) -> None:
    sent: list[Message] = []
    scheduler = Scheduler(engine, send=sent.append, worker_name="test", max_batch_tokens=200, max_batch_seqs=16)
    chunk = _chunk("lexical", [10])
    chunk.task = "lexical"
    scheduler.accept(chunk)
    assert scheduler.next_batch() is None
    assert [(type(m).__name__, m.code) for m in sent if isinstance(m, Error)] == [("Error", "bad_input")]


def test_only_a_step_no_later_arrival_could_join_is_taken_when_closed_only(engine: Engine) -> None:
    scheduler = Scheduler(engine, send=lambda message: None, worker_name="test", max_batch_tokens=100,
                          max_batch_seqs=4, shared_step_tokens=60)
    scheduler.accept(_chunk("short", [20, 20], seed=1))
    assert scheduler.next_batch(closed_only=True) is None  # 40 tokens: a later chunk's row could still join
    assert scheduler.jobs["short"].next_row == 0 and scheduler.planner.waiting_seqs == 2  # and nothing was taken
    scheduler.accept(_chunk("more", [20], seed=2))
    picked = scheduler.next_batch(closed_only=True)  # 60 tokens: the shared cap
    assert picked is not None and [ref.job.chunk.chunk_id for ref in picked[1]] == ["short", "short", "more"]
    scheduler.accept(_chunk("many", [1] * 6, seed=3))
    picked = scheduler.next_batch(closed_only=True)  # the sequence cap of 4
    assert picked is not None and [ref.row for ref in picked[1]] == [0, 1, 2, 3]
    bulk = _chunk("bulk", [60, 40], seed=4)
    bulk.priority = PRIORITY_BACKGROUND
    scheduler.accept(bulk)
    assert scheduler.next_batch() is not None  # "many"'s last two rows
    scheduler.planner.online_seen -= ONLINE_RECENT_S  # background rows alone: an online arrival would go first
    assert scheduler.next_batch(closed_only=True) is None
    picked = scheduler.next_batch()
    assert picked is not None and [ref.job.chunk.chunk_id for ref in picked[1]] == ["bulk", "bulk"]


def test_arrivals_too_few_to_close_a_step_are_not_planned_and_every_step_stays_the_same(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a step runs, each arrival asks for a closed step; while fewer rows or tokens wait than a closed
    step holds, the scheduler answers None without planning. Against a scheduler that plans every time, on
    random arrivals (lengths, priorities, budgets, caps, a clock that moves, cancels, whole plans between):
    the same steps, in the same order, to the last row."""
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    rng = np.random.default_rng(5)
    spared = 0

    def steps(bound_check: bool, case: dict) -> list:
        nonlocal spared
        scheduler = Scheduler(engine, send=lambda message: None, worker_name="test", max_batch_tokens=case["tokens"],
                              max_batch_seqs=case["seqs"], shared_step_tokens=case["shared"])
        could_close = scheduler.planner._could_close
        if bound_check:
            def counted() -> bool:
                nonlocal spared
                answer = could_close()
                spared += not answer
                return answer
            scheduler.planner._could_close = counted  # type: ignore[method-assign]
        else:
            scheduler.planner._could_close = lambda: True  # type: ignore[method-assign]
        clock[0] = 1000.0
        taken = []
        for index, (lens, priority, advance, action) in enumerate(case["arrivals"]):
            clock[0] += advance
            chunk = _chunk(f"c{index}", lens, seed=index)
            chunk.priority = priority
            scheduler.accept(chunk)
            if action == "cancel":
                scheduler.accept(Cancel(chunk_id=f"c{index // 2}"))
            picked = scheduler.next_batch(closed_only=action != "plan")
            if picked is not None:
                taken.append([(ref.job.chunk.chunk_id, ref.row) for ref in picked[1]])
        while (picked := scheduler.next_batch()) is not None:
            clock[0] += 0.01
            taken.append([(ref.job.chunk.chunk_id, ref.row) for ref in picked[1]])
        return taken

    for _ in range(150):
        arrivals = [(rng.integers(1, 40, size=int(rng.integers(1, 5))).tolist(),
                     PRIORITY_BACKGROUND if rng.random() < 0.25 else 0, float(rng.choice([0.0, 0.01, 0.2, 3.0])),
                     rng.choice(["closed", "closed", "closed", "plan", "cancel"])) for _ in range(int(rng.integers(1, 25)))]
        case = {"arrivals": arrivals, "tokens": int(rng.integers(40, 300)), "seqs": int(rng.integers(2, 16)),
                "shared": int(rng.integers(20, 200))}
        assert steps(True, case) == steps(False, case), case
    assert spared > 100  # the bound check spared plans, not only let them through


def _serve(scheduler: Scheduler, faulty: FaultyEngine, sent: list[Message], first: Chunk,
           later: Chunk) -> dict[str, Result]:
    """`first` waiting when the loop starts, `later` sent once `first`'s step is on the device; the answers."""
    inbox: queue.Queue = queue.Queue()
    inbox.put(first)
    stop, drain = threading.Event(), threading.Event()
    loop = threading.Thread(target=scheduler.run, args=(inbox, stop, drain), daemon=True)
    loop.start()
    deadline = time.monotonic() + 60
    while not faulty.timeline and time.monotonic() < deadline:
        time.sleep(0.001)
    inbox.put(later)
    drain.set()
    loop.join(timeout=60)
    assert not loop.is_alive()
    return {m.chunk_id: m for m in sent if isinstance(m, Result)}


@pytest.mark.parametrize("queue_steps", [True, False])
def test_a_closed_step_is_queued_behind_the_running_one_and_an_open_one_waits_for_it(
        engine: Engine, queue_steps: bool) -> None:
    """With steps that take the device 300 ms (after the one before): the chunk that arrives during the
    first step fills the shared cap with two rows, so that step is launched at once, behind the first;
    its last row (30 tokens, room for more) waits for the device. Every row stays on its sequence."""
    sent: list[Message] = []
    faulty = FaultyEngine(engine, {"step_ms": 300})
    scheduler = Scheduler(faulty, send=sent.append, worker_name="test", max_batch_tokens=100, max_batch_seqs=16,
                          shared_step_tokens=60, queue_steps=queue_steps)
    first, later = _chunk("first", [20], seed=1), _chunk("later", [50, 50, 30], seed=2)
    results = _serve(scheduler, faulty, sent, first, later)
    assert sorted(results) == ["first", "later"]
    for chunk in (first, later):
        np.testing.assert_allclose(results[chunk.chunk_id].values, _expected(engine, chunk), atol=1e-4)
    (launch_1, ready_1), (launch_2, ready_2), (launch_3, _) = faulty.timeline
    assert (launch_2 < ready_1) == queue_steps  # queued behind the running step, or launched after it
    assert launch_3 >= ready_2  # an open step waits for the device, for whoever arrives meanwhile
    # queued: the device goes from the first step to the second without waiting for the host
    assert ready_2 - ready_1 == pytest.approx(0.3, abs=1e-6) if queue_steps else ready_2 - ready_1 >= 0.3
    # a chunk's inference time counts the device's time on its steps, not its wait behind another step
    assert results["later"].inference_s == pytest.approx(0.6, abs=0.1)
