"""Bucket shapes, step packing and result slots: the bookkeeping that keeps rows on their sequences."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quiver.worker.engine import Batch
from quiver.worker.engine.buckets import maxlen_bucket, plan_shape, seq_bucket, token_bucket, token_buckets
from quiver.worker.engine.inputs import pack_batch, packed_size, unpack
from quiver.worker.engine.lazy import HostSlots, LazyTensor, SlotsBusyError


def test_token_buckets_step_by_64_then_256() -> None:
    assert [token_bucket(n) for n in (1, 64, 65, 1024, 1025, 1280, 1281)] == [64, 64, 128, 1024, 1280, 1280, 1536]
    buckets = token_buckets(2048)
    assert buckets[:3] == [64, 128, 192] and buckets[-3:] == [1536, 1792, 2048] and len(buckets) == 20
    assert [seq_bucket(n) for n in (1, 2, 3, 5, 256, 257)] == [1, 2, 4, 8, 256, 512]
    assert maxlen_bucket(3, 64) == 64 and maxlen_bucket(300, 1024) == 512 and maxlen_bucket(900, 960) == 960


def test_plan_shape_padding_dense_and_eager() -> None:
    lens = np.array([100, 30], dtype=np.int32)
    shape = plan_shape(lens, 4096, 64)
    assert (shape.num_seqs, shape.num_tokens, shape.max_seqlen, shape.dense_len) == (4, 192, 128, 0)
    assert shape.graphable
    dense = plan_shape(np.array([512] * 4, dtype=np.int32), 4096, 64)
    assert (dense.num_seqs, dense.num_tokens, dense.dense_len, dense.graphable) == (4, 2048, 512, True)
    too_big = plan_shape(np.array([3000, 3000], dtype=np.int32), 4096, 64)
    assert (too_big.num_seqs, too_big.num_tokens, too_big.graphable) == (2, 6000, False)
    exact = plan_shape(lens, 0, 0)
    assert (exact.num_seqs, exact.num_tokens, exact.graphable) == (2, 130, False)


def test_pack_batch_layout() -> None:
    batch = Batch(
        input_ids=np.array([5, 6, 7, 8, 9], dtype=np.int32),
        seq_lens=np.array([2, 3], dtype=np.int32),
        token_type_ids=np.array([0, 1, 0, 0, 1], dtype=np.int32),
        normalize=np.array([True, False]),
    )
    shape = plan_shape(batch.seq_lens, 4096, 64)
    assert (shape.num_seqs, shape.num_tokens) == (4, 64)
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
