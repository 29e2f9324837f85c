"""Ragged token ids: sequences of different lengths laid end to end, with no padding.

One type carries token ids from the frontend's tokenizer through the wire to the worker's engine. The
per-row offsets are computed once per instance and cached; slicing rows gives views over the same ids.
Where bytes enter a process (the frontend's request, the worker's decoded chunk) `validate` checks what
the rest of that process relies on and raises RaggedError, which each boundary turns into its own error
format; past that point only cheap shape checks remain.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence, TypeVar

import numpy as np
import numpy.typing as npt

RaggedT = TypeVar("RaggedT", bound="RaggedIds")

# RaggedError codes: what a boundary maps to its own error (a 4xx, a BAD_INPUT chunk error).
SHAPE = "shape"  # arrays that do not fit together (lengths, dtypes, row count)
EMPTY_ROW = "empty_row"
TOO_MANY_ROWS = "too_many_rows"
TOO_LONG = "too_long"
OUT_OF_VOCABULARY = "out_of_vocabulary"
BAD_TOKEN_TYPE = "bad_token_type"


class RaggedError(ValueError):
    """Ragged ids that break a limit: `code` says which check, `row` the first row that failed it (if
    one row did) and `value` the offending number (a length, a token id)."""

    def __init__(self, code: str, message: str, row: int | None = None, value: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.row = row
        self.value = value


@dataclass(frozen=True)
class RaggedLimits:
    """What a boundary checks; a limit left None is not checked there."""

    vocab_size: int | None = None
    max_length: int | None = None
    max_rows: int | None = None
    type_vocab_size: int | None = None  # None: token types are not read, so only their shape matters


@dataclass(frozen=True, eq=False)
class RaggedIds:
    """input_ids: int [num_tokens], every row's ids one after another; seq_lens: int32 [num_seqs], each
    row's length; token_type_ids: int [num_tokens] (segment ids of text pairs) or None."""

    input_ids: np.ndarray
    seq_lens: np.ndarray
    token_type_ids: np.ndarray | None = None

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @cached_property
    def offsets(self) -> np.ndarray:
        """int64 [num_seqs + 1]: where each row starts in input_ids, then num_tokens (once summed)."""
        offsets = np.zeros(self.num_seqs + 1, dtype=np.int64)
        np.cumsum(self.seq_lens, out=offsets[1:])
        return offsets

    @classmethod
    def from_lists(cls, ids: Sequence[Sequence[int]], types: Sequence[Sequence[int]] | None = None,
                   dtype: npt.DTypeLike = np.int32) -> RaggedIds:
        """From one list of ids per row. Raises OverflowError for an id that `dtype` cannot hold."""
        lens = np.fromiter((len(row) for row in ids), dtype=np.int32, count=len(ids))
        total = int(lens.sum(dtype=np.int64))

        def flat(rows: Sequence[Sequence[int]]) -> np.ndarray:
            return np.fromiter(itertools.chain.from_iterable(rows), dtype=dtype, count=total)

        return cls(flat(ids), lens, flat(types) if types is not None else None)

    @classmethod
    def from_frames(cls, ids: bytes | memoryview, lens: bytes | memoryview, types: bytes | memoryview | None,
                    num_seqs: int, num_tokens: int) -> RaggedIds:
        """Views over received little-endian int32 frames (no copy); RaggedError (SHAPE) when a frame's
        size does not match the counts given, or the lengths do not add up to num_tokens."""
        arrays = [_int32_frame("input_ids", ids, num_tokens), _int32_frame("seq_lens", lens, num_seqs)]
        ragged = cls(arrays[0], arrays[1], _int32_frame("token_type_ids", types, num_tokens) if types is not None else None)
        if num_seqs == 1:  # a lone sequence (batch 1): its length is the count, its offsets known without a sum
            if int(arrays[1][0]) != num_tokens or num_tokens < 1:
                raise RaggedError(SHAPE, f"seq_lens must be positive and sum to num_tokens ({num_tokens})")
            return _with_offsets(ragged, np.array([0, num_tokens], dtype=np.int64))
        if num_seqs and (int(ragged.seq_lens.min()) < 1 or int(ragged.offsets[-1]) != num_tokens):
            raise RaggedError(SHAPE, f"seq_lens must be positive and sum to num_tokens ({num_tokens})")
        return ragged

    def row(self, index: int) -> np.ndarray:
        """Row `index`'s ids (a view)."""
        return self.input_ids[self.offsets[index]:self.offsets[index + 1]]

    def rows(self, start: int, end: int) -> RaggedIds:
        """Rows [start, end) as ragged ids over the same arrays (views; offsets shifted, not summed again)."""
        lo, hi = int(self.offsets[start]), int(self.offsets[end])
        types = self.token_type_ids[lo:hi] if self.token_type_ids is not None else None
        return _with_offsets(RaggedIds(self.input_ids[lo:hi], self.seq_lens[start:end], types),
                             self.offsets[start:end + 1] - lo)

    @classmethod
    def gather(cls: type[RaggedT], picks: Sequence[tuple[RaggedIds, int]], **fields: object) -> RaggedT:
        """One row from each (source, row) pair, in that order, as new int32 ragged ids: a copy, unless the
        pairs are every row of one int32 source in order (a lone request's chunk), whose arrays and offsets
        are then taken as they are. Rows of a source without token types get zeros when another source has
        them. `fields` go to cls."""
        source = picks[0][0] if picks else None
        if (source is not None and len(picks) == source.num_seqs and _int32(source)
                and all(picked is source and row == i for i, (picked, row) in enumerate(picks))):
            return _with_offsets(cls(source.input_ids, source.seq_lens, source.token_type_ids, **fields),
                                 source.offsets)
        lens = np.fromiter((int(source.seq_lens[row]) for source, row in picks), dtype=np.int32, count=len(picks))
        ids = np.concatenate([source.row(row) for source, row in picks]).astype(np.int32, copy=False)
        types = None
        if any(source.token_type_ids is not None for source, _ in picks):
            types = np.concatenate([
                source.token_type_ids[source.offsets[row]:source.offsets[row + 1]]
                if source.token_type_ids is not None else np.zeros(int(source.seq_lens[row]), dtype=np.int32)
                for source, row in picks
            ]).astype(np.int32, copy=False)
        return cls(ids, lens, types, **fields)

    @classmethod
    def concat(cls, parts: Sequence[RaggedIds]) -> RaggedIds:
        """Every row of each part, parts in order (a copy). Parts without token types get zeros when
        another part has them."""
        types = None
        if any(part.token_type_ids is not None for part in parts):
            types = np.concatenate([part.token_type_ids if part.token_type_ids is not None
                                    else np.zeros(part.num_tokens, dtype=part.input_ids.dtype) for part in parts])
        return cls(np.concatenate([part.input_ids for part in parts]),
                   np.concatenate([part.seq_lens for part in parts]), types)

    def truncated(self, max_length: int, direction: str = "right") -> RaggedIds:
        """Each row cut to at most max_length ids on the `direction` side: "right" keeps a row's first
        ids, "left" its last ones (the tokenizers' truncation direction). Self when no row is longer."""
        if self.num_seqs == 0 or int(self.seq_lens.max()) <= max_length:
            return self
        lens = np.minimum(self.seq_lens, max_length).astype(np.int32)
        starts = self.offsets[:-1] if direction == "right" else self.offsets[1:] - lens
        new_offsets = np.zeros(self.num_seqs + 1, dtype=np.int64)
        np.cumsum(lens, out=new_offsets[1:])
        index = np.repeat(starts - new_offsets[:-1], lens) + np.arange(int(new_offsets[-1]))
        types = self.token_type_ids[index] if self.token_type_ids is not None else None
        return _with_offsets(RaggedIds(self.input_ids[index], lens, types), new_offsets)

    def with_dtype(self, dtype: npt.DTypeLike) -> RaggedIds:
        """The same rows with ids (and token types) in `dtype`; self when they already are."""
        if self.input_ids.dtype == dtype and (self.token_type_ids is None or self.token_type_ids.dtype == dtype):
            return self
        types = self.token_type_ids.astype(dtype) if self.token_type_ids is not None else None
        return RaggedIds(self.input_ids.astype(dtype), self.seq_lens, types)

    def validate(self, limits: RaggedLimits) -> None:
        """Raise RaggedError unless the arrays fit together and every row is within `limits`. Checks run
        in this order: shape, row count, empty rows, token ids, lengths, token types."""
        check_shape(self)
        if limits.max_rows is not None and self.num_seqs > limits.max_rows:
            raise RaggedError(TOO_MANY_ROWS, f"{self.num_seqs} rows, more than {limits.max_rows}", value=self.num_seqs)
        if self.num_seqs == 0:
            raise RaggedError(SHAPE, "no rows")
        lens = self.seq_lens
        # One reduction per check on the good path; the offending row is looked for only on the bad one.
        if int(lens.min()) < 1:
            row = int(np.flatnonzero(lens < 1)[0])
            raise RaggedError(EMPTY_ROW, f"row {row} has no tokens", row=row)
        if limits.vocab_size is not None:
            self._check_range(self.input_ids, limits.vocab_size, OUT_OF_VOCABULARY, "token id")
        if limits.max_length is not None and int(lens.max()) > limits.max_length:
            row = int(np.flatnonzero(lens > limits.max_length)[0])
            raise RaggedError(TOO_LONG, f"row {row} has {int(lens[row])} tokens, more than {limits.max_length}",
                              row=row, value=int(lens[row]))
        if limits.type_vocab_size is not None and self.token_type_ids is not None:
            self._check_range(self.token_type_ids, limits.type_vocab_size, BAD_TOKEN_TYPE, "token type")

    def _check_range(self, values: np.ndarray, size: int, code: str, what: str) -> None:
        # Seen as unsigned, a negative value is larger than any size: one reduction checks both bounds.
        if int(values.view(np.dtype(f"u{values.dtype.itemsize}")).max()) < size:
            return
        position = int(np.flatnonzero((values < 0) | (values >= size))[0])
        row = int(np.searchsorted(self.offsets, position, side="right")) - 1
        value = int(values[position])
        raise RaggedError(code, f"row {row} holds {what} {value}, outside [0, {size})", row=row, value=value)


def check_shape(ragged: RaggedIds) -> None:
    """RaggedError (SHAPE) unless the arrays are one-dimensional integers whose sizes fit together: what
    code behind a validating boundary still checks (no pass over the ids; the offsets are cached)."""
    ids, lens, types = ragged.input_ids, ragged.seq_lens, ragged.token_type_ids
    for name, array in (("input_ids", ids), ("seq_lens", lens), ("token_type_ids", types)):
        if array is not None and (array.ndim != 1 or array.dtype.kind not in "iu"):  # signed or unsigned integers
            raise RaggedError(SHAPE, f"{name} must be a one-dimensional integer array")
    if types is not None and types.shape != ids.shape:
        raise RaggedError(SHAPE, f"token_type_ids has {types.shape[0]} entries for {ids.shape[0]} token ids")
    if int(ragged.offsets[-1]) != ragged.num_tokens:
        raise RaggedError(SHAPE, f"seq_lens sum to {int(ragged.offsets[-1])} but input_ids has {ragged.num_tokens}")


def _int32(ragged: RaggedIds) -> bool:
    return all(array is None or array.dtype == np.int32
               for array in (ragged.input_ids, ragged.seq_lens, ragged.token_type_ids))


def _with_offsets(ragged: RaggedT, offsets: np.ndarray) -> RaggedT:
    """Seed the offsets cache of freshly made ragged ids with offsets already known."""
    ragged.__dict__["offsets"] = offsets
    return ragged


def _int32_frame(name: str, frame: bytes | memoryview, count: int) -> np.ndarray:
    view = memoryview(frame)
    if view.nbytes != 4 * count:
        raise RaggedError(SHAPE, f"frame {name!r} holds {view.nbytes} bytes, the header implies {4 * count}")
    return np.frombuffer(view, dtype="<i4")
