"""broker/dispatch.py on its own, no sockets: the choice of worker, capacity, the bounded queue,
requeue to the front, cancel, expiry, hold deadlines, duplicate detection and the pools per model."""

from __future__ import annotations

import numpy as np
import pytest

from quiver.broker.dispatch import Dispatcher, PendingChunk, QueueFull, WorkerState
from quiver.common.protocol import PRIORITY_BACKGROUND, PRIORITY_ONLINE, Chunk, Routed, peek


def pending(chunk_id: str, tokens: int = 10, task: str = "embed", deadline: float = 100.0,
            frontend: bytes = b"f", model: str = "", priority: int = PRIORITY_ONLINE, seqs: int = 1) -> PendingChunk:
    """A chunk as the broker holds it: `seqs` sequences of equal length sharing `tokens` (a multiple)."""
    message = Chunk(chunk_id=chunk_id, task=task, num_seqs=seqs, num_tokens=tokens, normalize=True, timeout_s=5.0,
                    model=model, priority=priority, input_ids=np.zeros(tokens, dtype=np.int32),
                    seq_lens=np.full(seqs, tokens // seqs, dtype=np.int32))
    routed = peek([bytes(f) for f in message.encode()])
    assert isinstance(routed, Routed)
    return PendingChunk(message=routed, frontends=[frontend], deadline=deadline)


def worker(name: str, capacity: int = 100, tasks: tuple[str, ...] = ("embed",), fingerprint: str = "") -> WorkerState:
    return WorkerState(identity=name.encode(), name=name, device="cpu", capacity_tokens=capacity,
                       tasks=frozenset(tasks), expiry=10.0, output_dim=4, fingerprint=fingerprint)


def with_workers(*workers: WorkerState, max_queued: int = 3) -> Dispatcher:
    dispatcher = Dispatcher(max_queued)
    for w in workers:
        dispatcher.add_worker(w)
    return dispatcher


def test_the_worker_with_fewest_outstanding_tokens_is_chosen():
    a, b = worker("a"), worker("b")
    dispatcher = with_workers(a, b)
    dispatcher.assign(pending("1", tokens=50), a)
    assert dispatcher.pick_worker(pending("2", tokens=10)) is b
    dispatcher.assign(pending("3", tokens=60), b)
    assert dispatcher.pick_worker(pending("4", tokens=10)) is a
    assert (a.outstanding_tokens, b.outstanding_tokens) == (50, 60)


def test_capacity_bounds_a_busy_worker_but_an_idle_one_takes_any_chunk():
    a = worker("a", capacity=100)
    dispatcher = with_workers(a)
    assert dispatcher.pick_worker(pending("big", tokens=500)) is a  # idle: takes it whatever its size
    dispatcher.assign(pending("1", tokens=80), a)
    assert dispatcher.pick_worker(pending("2", tokens=20)) is a  # 80 + 20 fits
    assert dispatcher.pick_worker(pending("3", tokens=21)) is None  # 80 + 21 does not


def test_task_and_draining_exclude_a_worker():
    scorer, embedder = worker("s", tasks=("score",)), worker("e")
    dispatcher = with_workers(scorer, embedder)
    assert dispatcher.pick_worker(pending("1", task="score")) is scorer
    scorer.draining = True
    assert dispatcher.pick_worker(pending("2", task="score")) is None


def test_the_queue_is_bounded_fifo_and_requeues_go_to_the_front_past_the_bound():
    dispatcher = with_workers(max_queued=2)
    dispatcher.enqueue(pending("1"))
    dispatcher.enqueue(pending("2"))
    with pytest.raises(QueueFull):
        dispatcher.enqueue(pending("3"))
    dispatcher.enqueue(pending("again"), front=True)  # admitted once already: never refused
    assert [c.chunk_id for c in dispatcher.take_queued(lambda chunk: True)] == ["again", "1", "2"]
    assert not dispatcher.queued_ids


def test_duplicates_are_known_while_queued_or_in_flight_and_completion_happens_once():
    a = worker("a")
    dispatcher = with_workers(a)
    chunk = pending("1", tokens=30)
    dispatcher.enqueue(chunk)
    assert dispatcher.knows("1") and dispatcher.find("1") is chunk
    assert dispatcher.take_dispatchable() == (chunk, a)
    dispatcher.assign(chunk, a)
    assert dispatcher.knows("1") and a.outstanding_tokens == 30
    assert dispatcher.complete("1") is chunk
    assert dispatcher.complete("1") is None  # a second result is a duplicate
    assert not dispatcher.knows("1") and a.outstanding_tokens == 0 and not a.inflight


def test_cancel_removes_a_queued_chunk_or_releases_an_assigned_one_naming_its_worker():
    a = worker("a")
    dispatcher = with_workers(a)
    dispatcher.enqueue(pending("queued"))
    cancelled = dispatcher.cancel("queued")
    assert cancelled is not None and cancelled.worker is None and not dispatcher.queue
    dispatcher.assign(pending("running", tokens=40), a)
    cancelled = dispatcher.cancel("running")
    assert cancelled is not None and cancelled.worker == b"a"
    assert a.outstanding_tokens == 0 and not dispatcher.knows("running")
    assert dispatcher.cancel("unknown") is None


def test_removing_a_worker_returns_its_chunks_unassigned():
    a, b = worker("a"), worker("b")
    dispatcher = with_workers(a, b)
    dispatcher.assign(pending("1"), a)
    dispatcher.assign(pending("2"), a)
    orphans = dispatcher.remove_worker(b"a")
    assert sorted(c.chunk_id for c in orphans) == ["1", "2"]
    assert all(c.worker is None for c in orphans) and not dispatcher.inflight
    assert list(dispatcher.workers) == [b"b"]


def test_a_second_ready_from_the_same_identity_keeps_its_chunks():
    a = worker("a")
    dispatcher = with_workers(a)
    dispatcher.assign(pending("1", tokens=25), a)
    again = worker("a")
    dispatcher.add_worker(again)
    assert dispatcher.workers[b"a"] is again and "1" in again.inflight and again.outstanding_tokens == 25


def test_expiry_of_queued_chunks_and_of_silent_workers():
    a = worker("a")
    dispatcher = with_workers(a)
    dispatcher.enqueue(pending("soon", deadline=5.0))
    dispatcher.enqueue(pending("later", deadline=50.0))
    assert [c.chunk_id for c in dispatcher.take_expired_queued(now=10.0)] == ["soon"]
    assert [c.chunk_id for c in dispatcher.queue] == ["later"] and dispatcher.queued_ids == {"later"}
    assert dispatcher.expired_workers(now=5.0) == [] and dispatcher.expired_workers(now=11.0) == [a]


def test_a_chunk_held_past_its_hold_deadline_is_taken_back_and_its_holder_remembered():
    a, b = worker("a"), worker("b")
    dispatcher = with_workers(a, b)
    slow, quick = pending("slow", tokens=30), pending("quick", tokens=5)
    dispatcher.assign(slow, a, hold_until=10.0)
    dispatcher.assign(quick, b, hold_until=100.0)
    assert dispatcher.take_overdue(now=5.0) == []
    assert dispatcher.take_overdue(now=11.0) == [(slow, a)]
    assert slow.worker is None and slow.former_workers == {b"a"} and a.outstanding_tokens == 0
    assert not dispatcher.knows("slow") and dispatcher.knows("quick")
    dispatcher.complete("quick")
    assert dispatcher.pick_worker(slow) is b  # not back to the worker that sat on it


def test_a_chunk_goes_only_to_a_worker_of_the_model_it_names():
    mini, mini2, rerank = worker("m", fingerprint="aa"), worker("m2", fingerprint="aa"), worker("r", fingerprint="bb")
    dispatcher = with_workers(mini, mini2, rerank)
    dispatcher.assign(pending("1", tokens=50, model="aa"), mini)
    assert dispatcher.pick_worker(pending("2", model="aa")) is mini2  # least loaded within the model's pool
    dispatcher.assign(pending("3", tokens=90, model="aa"), mini2)
    assert dispatcher.pick_worker(pending("4", tokens=60, model="aa")) is None  # the idle reranker is no choice
    assert dispatcher.pick_worker(pending("5", model="bb")) is rerank
    assert dispatcher.pick_worker(pending("6", model="cc")) is None
    assert dispatcher.pick_worker(pending("7")) is rerank  # a chunk naming no model: any worker
    assert (dispatcher.live_workers("aa"), dispatcher.live_workers("bb"), dispatcher.live_workers("")) == (2, 1, 3)
    mini.draining = True
    assert dispatcher.live_workers("aa") == 2 and dispatcher.pick_worker(pending("8", tokens=20, model="aa")) is None


def test_each_model_waits_in_its_own_pool_so_a_busy_model_holds_back_no_other():
    mini, rerank = worker("m", capacity=10, fingerprint="aa"), worker("r", fingerprint="bb")
    dispatcher = with_workers(mini, rerank, max_queued=4)
    dispatcher.assign(pending("busy", tokens=10, model="aa"), mini)
    for chunk_id, model in (("a1", "aa"), ("b1", "bb"), ("a2", "aa"), ("b2", "bb")):
        dispatcher.enqueue(pending(chunk_id, model=model))
    with pytest.raises(QueueFull):  # one bound over every pool
        dispatcher.enqueue(pending("b3", model="bb"))
    assert sorted(dispatcher.pools) == ["aa", "bb"] and dispatcher.waits_ahead(pending("a9", model="aa"))
    ready = dispatcher.take_dispatchable()
    assert ready is not None and ready[0].chunk_id == "b1" and ready[1] is rerank  # past the waiting "a1"
    ready = dispatcher.take_dispatchable()
    assert ready is not None and ready[0].chunk_id == "b2" and "bb" not in dispatcher.pools  # an empty pool goes
    requeued = pending("a0", model="aa")
    dispatcher.enqueue(requeued, front=True, now=7.0)
    assert [c.chunk_id for c in dispatcher.pools["aa"]] == ["a0", "a1", "a2"] and requeued.queued_at == 7.0
    assert dispatcher.cancel("a1") is not None and dispatcher.find("a2") is not None
    dispatcher.complete("busy")
    ready = dispatcher.take_dispatchable()
    assert ready is not None and ready[0].chunk_id == "a0" and ready[1] is mini


def test_waiting_chunks_of_a_model_are_taken_by_condition_across_pools():
    dispatcher = with_workers(max_queued=5)
    for chunk_id, model, deadline in (("a", "aa", 5.0), ("b", "bb", 50.0), ("c", "bb", 5.0)):
        dispatcher.enqueue(pending(chunk_id, model=model, deadline=deadline))
    assert sorted(c.chunk_id for c in dispatcher.take_expired_queued(now=10.0)) == ["a", "c"]
    assert list(dispatcher.pools) == ["bb"] and dispatcher.queued_ids == {"b"}
    assert [c.chunk_id for c in dispatcher.take_queued(lambda c: c.model == "bb")] == ["b"]
    assert not dispatcher.pools and not dispatcher.queue


def background(chunk_id: str, tokens: int = 10, deadline: float = 100.0) -> PendingChunk:
    return pending(chunk_id, tokens=tokens, deadline=deadline, priority=PRIORITY_BACKGROUND)


def drain(dispatcher: Dispatcher) -> list[tuple[str, str]]:
    """(chunk id, worker name) of every queued chunk a worker can take now, in dispatch order."""
    sent = []
    while (ready := dispatcher.take_dispatchable()) is not None:
        chunk, chosen = ready
        dispatcher.assign(chunk, chosen)
        sent.append((chunk.chunk_id, chosen.name))
    return sent


def test_queued_online_chunks_leave_before_background_ones_whatever_their_arrival():
    a = worker("a", capacity=100)
    dispatcher = with_workers(a, max_queued=10)
    dispatcher.max_background = 10
    dispatcher.assign(pending("busy", tokens=100), a)  # a is full: everything below waits
    arrivals = (background("b1"), background("b2"), pending("o1"), background("b3"), pending("o2"))
    # whether queued chunks go first: not for the first of each priority, as online ignores background
    for chunk, behind in zip(arrivals, (False, True, False, True, True)):
        assert dispatcher.waits_ahead(chunk) == behind
        dispatcher.enqueue(chunk)
    assert drain(dispatcher) == []
    dispatcher.complete("busy")
    assert [chunk_id for chunk_id, _ in drain(dispatcher)] == ["o1", "o2", "b1", "b2", "b3"]


def test_a_background_chunk_never_delays_an_online_chunks_dispatch():
    a, b = worker("a", capacity=100), worker("b", capacity=100)
    dispatcher = with_workers(a, b, max_queued=10)
    for i in range(10):
        dispatcher.enqueue(background(f"b{i}", tokens=25))
    sent = drain(dispatcher)
    # each worker holds max_background (4) background chunks, here its whole capacity
    assert sorted(name for _, name in sent) == ["a"] * 4 + ["b"] * 4
    assert (a.background_chunks, b.background_chunks) == (4, 4) and sum(c.background for c in dispatcher.queue) == 2
    online = pending("online", tokens=100)
    assert not dispatcher.waits_ahead(online)  # waiting background chunks do not go first
    assert dispatcher.pick_worker(online) is not None  # background tokens leave the capacity to online ones
    dispatcher.assign(online, dispatcher.pick_worker(online))  # type: ignore[arg-type]
    dispatcher.enqueue(pending("second", tokens=100))
    chunk_id, name = drain(dispatcher)[0]
    assert chunk_id == "second" and name != online.worker.decode()  # type: ignore[union-attr]
    # background chunks never pass queued online ones, nor enter a worker past the online capacity rule
    dispatcher.enqueue(pending("third", tokens=100))
    dispatcher.complete("b0")
    assert drain(dispatcher) == []
    assert [c.chunk_id for c in dispatcher.queue if not c.background] == ["third"]


def test_the_background_queue_has_its_own_bound_and_the_usual_cancel_and_expiry():
    dispatcher = with_workers(max_queued=2)
    dispatcher.enqueue(background("b1", deadline=5.0))
    dispatcher.enqueue(background("b2"))
    with pytest.raises(QueueFull):
        dispatcher.enqueue(background("b3"))
    dispatcher.enqueue(pending("o1"))  # a full background queue never refuses an online chunk
    dispatcher.enqueue(background("again"), front=True)
    assert dispatcher.knows("b2") and dispatcher.find("b2") is not None
    assert dispatcher.cancel("b2") is not None and not dispatcher.knows("b2")
    assert [c.chunk_id for c in dispatcher.take_expired_queued(now=10.0)] == ["b1"]
    assert [c.chunk_id for c in dispatcher.take_queued(lambda chunk: True)] == ["o1", "again"]
    assert not dispatcher.queued_ids
