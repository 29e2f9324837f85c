"""Bucket shapes, step packing and result slots: the bookkeeping that keeps rows on their sequences."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quiver.worker.engine import Batch
from quiver.worker.engine.buckets import (
    NO_GRAPHS, GraphLimits, StepShape, bucket_filling_lens, dense_priming_lens, example_lens, first_sight_key,
    graph_shapes, padded_shape, plan_shape, token_bucket, token_buckets,
)
from quiver.worker.engine.inputs import pack_batch, packed_size, unpack
from quiver.worker.engine.lazy import HostSlots, LazyTensor, SlotsBusyError


def test_token_buckets_step_by_64_then_256() -> None:
    assert [token_bucket(n) for n in (1, 64, 65, 1024, 1025, 1280, 1281)] == [64, 64, 128, 1024, 1280, 1280, 1536]
    buckets = token_buckets(2048)
    assert buckets[:3] == [64, 128, 192] and buckets[-3:] == [1536, 1792, 2048] and len(buckets) == 20


PPLX_LIMITS = GraphLimits(max_tokens=8192, max_rows=257, max_row_len=32768)


def test_plan_shape_classes_dense_and_eager() -> None:
    shape = plan_shape(np.array([100, 30], dtype=np.int32), PPLX_LIMITS)
    assert shape == StepShape(8, 192, 192, 0, True)  # 2 rows + the dummy: row class 8; 192 < 512
    assert plan_shape(np.array([512] * 16, dtype=np.int32), PPLX_LIMITS) == StepShape(32, 8192, 512, 0, True)
    assert plan_shape(np.array([4096], dtype=np.int32), PPLX_LIMITS) == StepShape(1, 4096, 4096, 4096, True)
    assert plan_shape(np.array([4000], dtype=np.int32), PPLX_LIMITS) == StepShape(2, 4096, 4096, 0, True)
    assert plan_shape(np.array([128], dtype=np.int32), PPLX_LIMITS) == StepShape(1, 128, 128, 128, True)
    assert plan_shape(np.array([3000, 3000, 3000], dtype=np.int32), PPLX_LIMITS) == StepShape(3, 9000, 3000, 3000, False)
    assert plan_shape(np.array([3000, 2999, 3000], dtype=np.int32), PPLX_LIMITS) == StepShape(3, 8999, 3000, 0, False)
    assert plan_shape(np.array([100, 30], dtype=np.int32), NO_GRAPHS) == StepShape(2, 130, 100, 0, False)


def test_eager_steps_of_unequal_rows_are_padded_to_their_bucket_where_the_limits_allow() -> None:
    """On a GPU an eager step's token count is its bucket's (one per 256), so that cuBLAS meets a bounded set
    of product shapes; equal rows keep their exact dense shape, and nothing pads past eager_pad_tokens."""
    gpu = GraphLimits(max_tokens=8192, max_rows=257, max_row_len=32768, eager_pad_tokens=16384)
    unequal = np.array([3000, 2999, 3000], dtype=np.int32)  # 8,999 tokens: bucket 9,216, a dummy row of 217
    assert plan_shape(unequal, gpu) == StepShape(4, 9216, 3000, 0, False)
    assert plan_shape(np.array([3000] * 3, dtype=np.int32), gpu) == StepShape(3, 9000, 3000, 3000, False)
    assert plan_shape(np.array([9000, 216], dtype=np.int32), gpu) == StepShape(2, 9216, 9000, 0, False)  # full
    assert plan_shape(np.array([16300, 10], dtype=np.int32), gpu) == StepShape(3, 16384, 16300, 0, False)
    assert plan_shape(np.array([16300, 85], dtype=np.int32), gpu) == StepShape(2, 16385, 16300, 0, False)
    tokens_only = GraphLimits(0, 0, 0, eager_pad_tokens=2048)  # graphs off: every step eager, still padded
    assert plan_shape(np.array([100, 30], dtype=np.int32), tokens_only) == StepShape(3, 192, 100, 0, False)
    assert plan_shape(np.array([20, 10], dtype=np.int32), tokens_only) == StepShape(3, 64, 34, 0, False)  # dummy 34


def test_equal_rows_padded_instead_of_dense_share_their_buckets_first_sight_key() -> None:
    """padded_shape runs equal rows as ragged rows padded to their bucket, as unequal rows would run: the
    same first-sight key as any ragged step of that bucket, where the dense shape has one of its own."""
    gpu = GraphLimits(max_tokens=8192, max_rows=257, max_row_len=32768, eager_pad_tokens=16384)
    equal = np.array([532] * 21, dtype=np.int32)  # 11,172 tokens: bucket 11,264, a dummy row of 92
    dense = plan_shape(equal, gpu)
    assert dense == StepShape(21, 11172, 532, 532, False)
    padded = padded_shape(equal, gpu)
    assert padded == StepShape(22, 11264, 532, 0, False)
    assert padded_shape(np.array([512] * 18, dtype=np.int32), gpu) == StepShape(18, 9216, 512, 0, False)  # full
    unequal = plan_shape(np.array([3000, 3000, 2100, 3000], dtype=np.int32), gpu)
    assert first_sight_key(padded) == first_sight_key(unequal) == (11264, 0, 0)
    assert first_sight_key(dense) == (11172, 532, 21)


def test_start_up_batches_fill_each_eager_bucket_within_the_row_cap_and_the_models_length() -> None:
    gpu = GraphLimits(max_tokens=8192, max_rows=257, max_row_len=8192, eager_pad_tokens=16384)
    for bucket in (8448, 12800, 16384):
        lens = bucket_filling_lens(bucket, max_row_len=8192, max_rows=256)
        assert lens is not None and sum(lens) == bucket - 1 and max(lens) == 512
        assert padded_shape(np.array(lens, dtype=np.int32), gpu).num_tokens == bucket
    few_rows = bucket_filling_lens(16384, max_row_len=8192, max_rows=8)  # rows of 2,048 to stay within 8
    assert few_rows is not None and len(few_rows) == 8 and sum(few_rows) == 16383
    assert bucket_filling_lens(16384, max_row_len=128, max_rows=64) is None  # 64 x 128 cannot reach it
    assert bucket_filling_lens(64, max_row_len=128, max_rows=64) == [63]


def test_dense_priming_steps_are_dense_eager_steps_with_token_counts_on_both_sides_of_16() -> None:
    gpu = GraphLimits(max_tokens=8192, max_rows=257, max_row_len=8192, eager_pad_tokens=16384)
    batches = dense_priming_lens(gpu, max_row_len=8192, max_tokens=16384, max_rows=256)
    assert batches == [[512] * 17, [511] * 17]  # 8,704 and 8,687 tokens: just above the graphs
    for lens in batches:
        shape = plan_shape(np.array(lens, dtype=np.int32), gpu)
        assert shape.dense_len == lens[0] and not shape.graphable
    assert sorted(sum(lens) % 16 == 0 for lens in batches) == [False, True]
    # Within the budget and the row cap, and for models whose rows are short: still two steps.
    assert dense_priming_lens(gpu, max_row_len=8192, max_tokens=4096, max_rows=256) == [[512] * 8, [511] * 8]
    assert dense_priming_lens(gpu, max_row_len=128, max_tokens=16384, max_rows=32) == [[128] * 32, [127] * 32]
    assert dense_priming_lens(NO_GRAPHS, max_row_len=8192, max_tokens=16384, max_rows=256) == [[512], [511]]


def test_a_padded_eager_step_packs_its_dummy_row_after_the_real_ones() -> None:
    limits = GraphLimits(0, 0, 0, eager_pad_tokens=2048)
    batch = Batch(input_ids=np.arange(1, 131, dtype=np.int32), seq_lens=np.array([100, 30], dtype=np.int32))
    shape = plan_shape(batch.seq_lens, limits)
    packed = np.empty(packed_size(shape.num_seqs, shape.num_tokens), dtype=np.int32)
    pack_batch(batch, shape, packed)
    step = unpack(torch.from_numpy(packed), shape)
    assert step.cu_seqlens.tolist() == [0, 100, 130, 192]
    assert step.seq_lens.tolist() == [100, 30, 62]
    assert step.input_ids[:130].tolist() == list(range(1, 131)) and not step.input_ids[130:].any()


def _random_batches(rng: np.random.Generator, limits: GraphLimits, count: int) -> list[np.ndarray]:
    batches = []
    for _ in range(count):
        rows = int(rng.integers(1, limits.max_rows))
        longest = int(rng.choice([8, 64, 200, 512, 513, 2000, limits.max_row_len]))
        lens = rng.integers(1, min(longest, limits.max_row_len) + 1, size=rows)
        lens = lens[np.cumsum(lens) <= limits.max_tokens] if lens[0] <= limits.max_tokens else lens[:1]
        batches.append(lens.astype(np.int32))
    return batches


@pytest.mark.parametrize("limits", [PPLX_LIMITS, GraphLimits(4096, 257, 512), GraphLimits(2048, 25, 100)])
def test_every_graphable_plan_is_in_the_graph_set(limits: GraphLimits) -> None:
    """The set captured at start-up covers every shape a batch can be planned to: no capture while serving."""
    shapes = set(graph_shapes(limits))
    assert len(shapes) == len(graph_shapes(limits))  # no shape listed twice
    rng = np.random.default_rng(5)
    planned = [plan_shape(lens, limits) for lens in _random_batches(rng, limits, 4000)]
    graphable = [shape for shape in planned if shape.graphable]
    assert len(graphable) > 0.5 * len(planned)
    assert {shape for shape in graphable} <= shapes
    for lens, shape in zip(_random_batches(np.random.default_rng(5), limits, 4000), planned):
        if shape.graphable:  # the padded batch fits its shape: rows, tokens, and every row within max_seqlen
            pad = shape.num_tokens - int(lens.sum())
            assert len(lens) + (1 if pad else 0) <= shape.num_seqs and 0 <= pad < 256
            assert max(int(lens.max()), pad) <= shape.max_seqlen <= shape.num_tokens


def test_graph_set_is_bounded_and_each_shape_has_a_filling_batch() -> None:
    shapes = graph_shapes(PPLX_LIMITS)
    assert len(shapes) == 500  # 456 ragged + 44 single-row dense: the count the README states
    assert len(graph_shapes(GraphLimits(8192, 257, 512))) == 182  # all-MiniLM-L6-v2 (rows of up to 512)
    for shape in shapes:
        lens = example_lens(shape, PPLX_LIMITS.max_row_len)
        assert sum(lens) == shape.num_tokens and len(lens) <= shape.num_seqs and max(lens) <= shape.max_seqlen
        assert plan_shape(np.array(lens), PPLX_LIMITS).num_tokens == shape.num_tokens
    short_rows = GraphLimits(1024, 17, 128)  # a model of 128 positions: no row may be longer, padding fills
    for shape in graph_shapes(short_rows):
        lens = example_lens(shape, 128)
        assert max(lens) <= 128 and sum(lens) <= shape.num_tokens
        assert len(lens) + (1 if sum(lens) < shape.num_tokens else 0) <= shape.num_seqs
        assert shape.dense_len <= 128
    assert graph_shapes(NO_GRAPHS) == []


def test_pack_batch_layout() -> None:
    batch = Batch(
        input_ids=np.array([5, 6, 7, 8, 9], dtype=np.int32),
        seq_lens=np.array([2, 3], dtype=np.int32),
        token_type_ids=np.array([0, 1, 0, 0, 1], dtype=np.int32),
        normalize=np.array([True, False]),
    )
    shape = StepShape(4, 64, 64, 0, True)
    buffer = np.full(packed_size(shape.num_seqs, shape.num_tokens) + 3, -7, dtype=np.int32)
    written = pack_batch(batch, shape, buffer)
    assert written == packed_size(4, 64) and (buffer[written:] == -7).all()
    step = unpack(torch.from_numpy(buffer), shape)
    assert step.input_ids[:6].tolist() == [5, 6, 7, 8, 9, 0]
    assert step.positions[:7].tolist() == [0, 1, 0, 1, 2, 0, 0] and int(step.positions[5:].abs().sum()) == 0
    assert step.seq_ids[:6].tolist() == [0, 0, 1, 1, 1, 2] and int(step.seq_ids[-1]) == 2
    assert step.token_type_ids[:5].tolist() == [0, 1, 0, 0, 1]
    assert step.cu_seqlens.tolist() == [0, 2, 5, 64, 64]
    assert step.seq_lens.tolist() == [2, 3, 59, 0]
    assert step.first_index.tolist() == [0, 2, 5, 63] and step.last_index.tolist() == [1, 4, 63, 63]
    assert step.normalize.tolist() == [1, 0, 0, 0]
    pack_batch(batch, shape, buffer, use_token_types=False)
    assert int(unpack(torch.from_numpy(buffer), shape).token_type_ids.abs().sum()) == 0


def test_result_slots_are_never_handed_out_twice() -> None:
    slots = HostSlots(2, rows=4, cols=3, pinned=False)
    first, second = slots.acquire(), slots.acquire()
    assert first != second
    with pytest.raises(SlotsBusyError):
        slots.acquire()
    lazy = LazyTensor(slots.buffers[first][:2].numpy(), None, slots, first)
    slots.buffers[first][:2] = 1.5
    own = lazy.wait()
    view = lazy.wait(copy=False)
    slots.buffers[first][:2] = 9.0
    assert (own == 1.5).all() and (view == 9.0).all()
    lazy.release()
    lazy.release()
    assert slots.acquire() == first
    with pytest.raises(RuntimeError):
        lazy.wait()


def _packed_by_rows(batch: Batch, shape: StepShape, use_token_types: bool) -> dict[str, list[int]]:
    """The packed fields written out row by row, as the layout describes them (the reference)."""
    rows, tokens = shape.num_seqs, shape.num_tokens
    lens = [int(n) for n in batch.seq_lens] + [tokens - batch.num_tokens] + [0] * rows
    lens = lens[:rows]
    ids = [int(x) for x in batch.input_ids] + [0] * (tokens - batch.num_tokens)
    types = ([int(x) for x in batch.token_type_ids] if batch.token_type_ids is not None and use_token_types
             else [0] * batch.num_tokens) + [0] * (tokens - batch.num_tokens)
    positions: list[int] = []
    seq_ids: list[int] = []
    cu = [0]
    for row, length in enumerate(lens):
        real = row < batch.num_seqs
        positions += list(range(length)) if real else [0] * length
        seq_ids += [row] * length
        cu.append(cu[-1] + length)
    flags = [int(x) for x in batch.normalize] if batch.normalize is not None else [0] * batch.num_seqs
    return {"input_ids": ids, "positions": positions, "token_type_ids": types, "seq_ids": seq_ids,
            "cu_seqlens": cu, "seq_lens": lens, "first_index": [min(c, tokens - 1) for c in cu[:-1]],
            "last_index": [min(max(c - 1, 0), tokens - 1) for c in cu[1:]],
            "normalize": flags + [0] * (rows - batch.num_seqs)}


def test_pack_batch_matches_a_row_by_row_layout_for_random_batches() -> None:
    rng = np.random.default_rng(3)
    limits = GraphLimits(max_tokens=512, max_rows=17, max_row_len=128)
    for _ in range(300):
        lens = rng.integers(1, 60, size=int(rng.integers(1, 9))).astype(np.int32)
        total = int(lens.sum())
        batch = Batch(input_ids=rng.integers(3, 1000, size=total).astype(np.int32), seq_lens=lens,
                      token_type_ids=rng.integers(0, 2, size=total).astype(np.int32) if rng.random() < 0.5 else None,
                      normalize=rng.random(lens.size) < 0.5 if rng.random() < 0.7 else None)
        shape = plan_shape(lens, limits)
        buffer = np.full(packed_size(shape.num_seqs, shape.num_tokens) + 2, -9, dtype=np.int32)
        for use_token_types in (True, False):
            written = pack_batch(batch, shape, buffer, use_token_types)
            assert written == packed_size(shape.num_seqs, shape.num_tokens) and (buffer[written:] == -9).all()
            step = unpack(torch.from_numpy(buffer), shape)
            for name, expected in _packed_by_rows(batch, shape, use_token_types).items():
                assert getattr(step, name).tolist() == expected, (name, lens.tolist(), shape)
