"""Ragged token ids: construction, offsets, views, gathering, truncation and boundary validation."""

from __future__ import annotations

import numpy as np
import pytest

from quiver.common.protocol import Chunk, decode
from quiver.common.ragged import (
    BAD_TOKEN_TYPE, EMPTY_ROW, OUT_OF_VOCABULARY, SHAPE, TOO_LONG, TOO_MANY_ROWS, RaggedError, RaggedIds,
    RaggedLimits, check_shape,
)

ROWS = [[5, 6, 7], [8], [9, 10], [11, 12, 13, 14]]


def test_from_lists_lays_rows_end_to_end_with_their_offsets():
    ragged = RaggedIds.from_lists(ROWS, [[0] * 3, [1], [0, 1], [1] * 4])
    assert ragged.input_ids.dtype == np.int32 and ragged.seq_lens.dtype == np.int32
    assert ragged.input_ids.tolist() == [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    assert ragged.seq_lens.tolist() == [3, 1, 2, 4]
    assert ragged.offsets.tolist() == [0, 3, 4, 6, 10]
    assert ragged.offsets is ragged.offsets  # summed once, then cached
    assert (ragged.num_seqs, ragged.num_tokens) == (4, 10)
    assert [ragged.row(i).tolist() for i in range(4)] == ROWS
    assert ragged.token_type_ids is not None and ragged.token_type_ids.tolist() == [0, 0, 0, 1, 0, 1, 1, 1, 1, 1]


def test_rows_are_views_with_shifted_offsets():
    ragged = RaggedIds.from_lists(ROWS, [[0] * 3, [1], [0, 1], [1] * 4])
    part = ragged.rows(1, 3)
    assert part.seq_lens.tolist() == [1, 2] and part.input_ids.tolist() == [8, 9, 10]
    assert part.offsets.tolist() == [0, 1, 3]
    assert part.token_type_ids is not None and part.token_type_ids.tolist() == [1, 0, 1]
    assert np.shares_memory(part.input_ids, ragged.input_ids)
    assert [part.row(i).tolist() for i in range(2)] == ROWS[1:3]
    assert ragged.rows(4, 4).num_seqs == 0 and ragged.rows(0, 4).offsets.tolist() == ragged.offsets.tolist()


def test_gather_takes_rows_from_several_sources_and_fills_missing_token_types():
    with_types = RaggedIds.from_lists([[1, 2], [3, 4, 5]], [[0, 1], [1, 1, 0]])
    without = RaggedIds.from_lists([[7], [8, 9]])
    batch = RaggedIds.gather([(with_types, 1), (without, 1), (with_types, 0)])
    assert batch.input_ids.tolist() == [3, 4, 5, 8, 9, 1, 2]
    assert batch.seq_lens.tolist() == [3, 2, 2] and batch.offsets.tolist() == [0, 3, 5, 7]
    assert batch.token_type_ids is not None and batch.token_type_ids.tolist() == [1, 1, 0, 0, 0, 0, 1]
    assert RaggedIds.gather([(without, 0), (without, 1)]).token_type_ids is None


def test_gather_of_every_row_of_one_int32_source_in_order_takes_its_arrays_without_a_copy():
    source = RaggedIds.from_lists([[1, 2], [3, 4, 5]], [[0, 1], [1, 1, 0]])
    whole = RaggedIds.gather([(source, 0), (source, 1)])
    assert whole.input_ids is source.input_ids and whole.token_type_ids is source.token_type_ids
    assert whole.offsets is source.offsets and whole.seq_lens.tolist() == [2, 3]
    for picks in ([(source, 1), (source, 0)], [(source, 0)], [(source, 0), (RaggedIds.from_lists([[3, 4, 5]]), 0)]):
        copied = RaggedIds.gather(picks)
        assert not np.shares_memory(copied.input_ids, source.input_ids)
    wide = RaggedIds.from_lists([[1, 2], [3]], dtype=np.int64)
    narrowed = RaggedIds.gather([(wide, 0), (wide, 1)])
    assert narrowed.input_ids.dtype == np.int32 and narrowed.input_ids.tolist() == [1, 2, 3]


def test_truncated_keeps_the_side_the_direction_does_not_cut():
    ragged = RaggedIds.from_lists(ROWS, [[0, 0, 1], [1], [0, 1], [0, 0, 1, 1]])
    right = ragged.truncated(2, "right")
    assert [right.row(i).tolist() for i in range(4)] == [[5, 6], [8], [9, 10], [11, 12]]
    assert right.offsets.tolist() == [0, 2, 3, 5, 7]
    assert right.token_type_ids is not None and right.token_type_ids.tolist() == [0, 0, 1, 0, 1, 0, 0]
    left = ragged.truncated(2, "left")
    assert [left.row(i).tolist() for i in range(4)] == [[6, 7], [8], [9, 10], [13, 14]]
    assert ragged.truncated(4) is ragged


def test_validate_names_the_check_and_the_first_row_that_fails_it():
    limits = RaggedLimits(vocab_size=15, max_length=3, max_rows=4)
    RaggedIds.from_lists([[1, 2, 3], [14]]).validate(limits)
    cases = [
        (RaggedIds.from_lists([[1], [], [2], []]), EMPTY_ROW, 1, None),
        (RaggedIds.from_lists([[1], [2, 15], [16]]), OUT_OF_VOCABULARY, 1, 15),
        (RaggedIds.from_lists([[1], [3, -1]], dtype=np.int64), OUT_OF_VOCABULARY, 1, -1),
        (RaggedIds.from_lists([[1, 2, 3], [1, 2, 3, 4], [1] * 9]), TOO_LONG, 1, 4),
        (RaggedIds.from_lists([[1]] * 5), TOO_MANY_ROWS, None, 5),
    ]
    for ragged, code, row, value in cases:
        with pytest.raises(RaggedError) as caught:
            ragged.validate(limits)
        assert (caught.value.code, caught.value.row, caught.value.value) == (code, row, value)


def test_token_types_are_range_checked_only_where_they_are_read():
    pair = RaggedIds.from_lists([[1, 2], [3]], [[0, 1], [2]])
    pair.validate(RaggedLimits(vocab_size=10))  # a model that does not read token types
    with pytest.raises(RaggedError) as caught:
        pair.validate(RaggedLimits(vocab_size=10, type_vocab_size=2))
    assert (caught.value.code, caught.value.row, caught.value.value) == (BAD_TOKEN_TYPE, 1, 2)


@pytest.mark.parametrize("ragged", [
    RaggedIds(np.arange(5, dtype=np.int32), np.array([2, 2], dtype=np.int32)),  # lengths sum to 4, not 5
    RaggedIds(np.arange(4, dtype=np.int32), np.array([2, 2], dtype=np.int32), np.zeros(3, dtype=np.int32)),
    RaggedIds(np.arange(4, dtype=np.float32), np.array([2, 2], dtype=np.int32)),
    RaggedIds(np.arange(4, dtype=np.int32).reshape(2, 2), np.array([2, 2], dtype=np.int32)),
    RaggedIds(np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32)),
])
def test_arrays_that_do_not_fit_together_are_shape_errors(ragged):
    with pytest.raises(RaggedError) as caught:
        ragged.validate(RaggedLimits())
    assert caught.value.code == SHAPE


def test_check_shape_does_not_read_the_ids():
    out_of_any_vocabulary = RaggedIds(np.array([-5, 2**30], dtype=np.int32), np.array([1, 1], dtype=np.int32))
    check_shape(out_of_any_vocabulary)
    with pytest.raises(RaggedError, match="sum to"):
        check_shape(RaggedIds(np.arange(3, dtype=np.int32), np.array([1, 1], dtype=np.int32)))


def test_from_frames_reads_int32_frames_without_copying_and_checks_their_sizes():
    ids = np.array([5, 6, 7, 8], dtype="<i4").tobytes()
    lens = np.array([3, 1], dtype="<i4").tobytes()
    ragged = RaggedIds.from_frames(ids, lens, None, num_seqs=2, num_tokens=4)
    assert ragged.input_ids.tolist() == [5, 6, 7, 8] and ragged.offsets.tolist() == [0, 3, 4]
    assert not ragged.input_ids.flags.owndata
    for frames, counts in (((ids[:-4], lens, None), (2, 4)), ((ids, lens, ids[:8]), (2, 4)),
                           ((ids, np.array([2, 1], dtype="<i4").tobytes(), None), (2, 4)),
                           ((ids, np.array([5, -1], dtype="<i4").tobytes(), None), (2, 4))):
        with pytest.raises(RaggedError) as caught:
            RaggedIds.from_frames(*frames, num_seqs=counts[0], num_tokens=counts[1])
        assert caught.value.code == SHAPE


def test_from_frames_of_one_sequence_checks_its_length_against_the_count():
    ids = np.array([5, 6, 7, 8], dtype="<i4").tobytes()
    ragged = RaggedIds.from_frames(ids, np.array([4], dtype="<i4").tobytes(), None, num_seqs=1, num_tokens=4)
    assert ragged.offsets.tolist() == [0, 4] and ragged.offsets.dtype == np.int64
    for length, tokens in ((3, 4), (5, 4), (-4, 4), (0, 0)):
        with pytest.raises(RaggedError) as caught:
            RaggedIds.from_frames(ids[:4 * tokens], np.array([length], dtype="<i4").tobytes(), None,
                                  num_seqs=1, num_tokens=tokens)
        assert caught.value.code == SHAPE


def test_a_chunk_carries_its_ragged_ids_across_the_wire():
    ragged = RaggedIds.from_lists(ROWS, [[0] * 3, [1], [0, 1], [1] * 4]).rows(1, 4)
    chunk = Chunk.from_ids(ragged, chunk_id="c1", task="embed", normalize=True, timeout_s=5.0)
    assert (chunk.num_seqs, chunk.num_tokens, chunk.has_token_types) == (3, 7, True)
    assert chunk.ids is ragged
    back = decode([bytes(frame) for frame in chunk.encode()])
    assert isinstance(back, Chunk)
    assert [back.ids.row(i).tolist() for i in range(3)] == ROWS[1:]
    assert back.ids.token_type_ids is not None and back.ids.token_type_ids.tolist() == [1, 0, 1, 1, 1, 1, 1]
    assert back.ids.offsets.tolist() == [0, 1, 3, 7]


def test_a_chunk_built_from_its_arrays_reads_them_as_ragged_ids():
    chunk = Chunk(chunk_id="c2", task="embed", num_seqs=2, num_tokens=3, normalize=False, timeout_s=1.0,
                  input_ids=np.array([1, 2, 3], dtype=np.int32), seq_lens=np.array([1, 2], dtype=np.int32))
    assert chunk.ids.input_ids is chunk.input_ids and chunk.ids.offsets.tolist() == [0, 1, 3]
    assert chunk.ids.token_type_ids is None


def test_concat_appends_every_row_of_each_part():
    first, second = RaggedIds.from_lists(ROWS[:2]), RaggedIds.from_lists(ROWS[2:], [[0, 1], [1, 1, 0, 0]])
    joined = RaggedIds.concat([first, second])
    assert [joined.row(i).tolist() for i in range(4)] == ROWS
    assert joined.offsets.tolist() == [0, 3, 4, 6, 10]
    assert joined.token_type_ids is not None and joined.token_type_ids.tolist() == [0, 0, 0, 0, 0, 1, 1, 1, 0, 0]
    assert RaggedIds.concat([first, first]).token_type_ids is None
