"""Packing a Batch into one int32 buffer laid out for a StepShape, and its device views.

Everything the model reads per step lives in one int32 array, so that one host-to-device copy moves a
whole step and CUDA graphs find their inputs at fixed addresses. Layout for num_seqs S, num_tokens T:
input_ids[T] positions[T] token_type_ids[T] seq_ids[T] cu_seqlens[S+1] first_index[S] last_index[S]
seq_lens[S] normalize[S].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from quiver.worker.engine.batch import Batch
from quiver.worker.engine.buckets import StepShape

_TOKEN_FIELDS = ("input_ids", "positions", "token_type_ids", "seq_ids")
_SEQ_FIELDS = ("first_index", "last_index", "seq_lens", "normalize")


def packed_size(num_seqs: int, num_tokens: int) -> int:
    return len(_TOKEN_FIELDS) * num_tokens + (num_seqs + 1) + len(_SEQ_FIELDS) * num_seqs


@dataclass(frozen=True)
class StepTensors:
    """Views of one packed step, all int32, on the model's device."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T] index of each token inside its own row
    token_type_ids: torch.Tensor  # [T]
    seq_ids: torch.Tensor  # [T] row of each token
    cu_seqlens: torch.Tensor  # [S+1]
    first_index: torch.Tensor  # [S] first token of each row (clamped into range for empty rows)
    last_index: torch.Tensor  # [S] last token of each row (clamped likewise)
    seq_lens: torch.Tensor  # [S]
    normalize: torch.Tensor  # [S] 1 where the row is to be L2-normalised


def pack_batch(batch: Batch, shape: StepShape, out: np.ndarray, use_token_types: bool = True) -> int:
    """Write the batch, padded to shape, into out (int32); return the number of int32s written.

    Padding: one row (index num_seqs) takes the tokens past the batch's, at position 0 with id 0; rows
    after it are empty (they begin and end at num_tokens, their first and last index the last token).
    use_token_types=False writes zeros as token types (RoBERTa-family models take none).

    It runs on every step's path, before the device can start: each numpy call costs microseconds
    there, so the fields are written with as few calls as the layout allows (slices of one arange, no
    temporaries the size of the shape).
    """
    n, t = batch.num_seqs, batch.num_tokens
    rows, tokens = shape.num_seqs, shape.num_tokens
    offsets = batch.offsets  # cached [n + 1]
    size = packed_size(rows, tokens)
    buf = out[:size]
    buf[:t] = batch.input_ids
    buf[t:tokens] = 0  # the padding tokens' ids
    if n == 1:  # a lone sequence (batch 1): its positions are the arange itself, no per-token offsets
        buf[tokens:tokens + t] = _arange(t)
    else:
        np.subtract(_arange(t), np.repeat(offsets[:-1], batch.seq_lens), out=buf[tokens:tokens + t])
    buf[tokens + t:2 * tokens] = 0  # and their positions
    types = buf[2 * tokens:3 * tokens]
    if batch.token_type_ids is None or not use_token_types:
        types[:] = 0
    else:
        types[:t] = batch.token_type_ids
        types[t:] = 0
    seq_ids = buf[3 * tokens:4 * tokens]
    seq_ids[:t] = 0 if n == 1 else np.repeat(_arange(n), batch.seq_lens)
    seq_ids[t:] = n
    cu = buf[4 * tokens:4 * tokens + rows + 1]
    cu[:n + 1] = offsets
    cu[n + 1:] = tokens
    o = 4 * tokens + rows + 1
    first, last, seq_lens, normalize = (buf[o + i * rows:o + (i + 1) * rows] for i in range(4))
    first[:n] = offsets[:-1]
    first[n:] = tokens - 1
    last[:n] = offsets[1:]
    last[:n] -= 1
    last[n:] = tokens - 1
    seq_lens[:n] = batch.seq_lens
    seq_lens[n:] = 0
    if tokens > t:
        first[n] = t
        seq_lens[n] = tokens - t
    normalize[:] = 0
    if batch.normalize is not None:
        normalize[:n] = batch.normalize
    return size


_ARANGE = np.arange(0, dtype=np.int32)


def _arange(count: int) -> np.ndarray:
    """0, 1, ..., count - 1 as int32: a slice of one array, grown when a longer one is asked for."""
    global _ARANGE
    if count > _ARANGE.shape[0]:
        _ARANGE = np.arange(max(count, 2 * _ARANGE.shape[0]), dtype=np.int32)
    return _ARANGE[:count]


def unpack(buffer: torch.Tensor, shape: StepShape) -> StepTensors:
    """Views into a packed int32 buffer (host or device) for the given shape."""
    rows, tokens = shape.num_seqs, shape.num_tokens
    fields: dict[str, torch.Tensor] = {}
    for i, name in enumerate(_TOKEN_FIELDS):
        fields[name] = buffer[i * tokens : (i + 1) * tokens]
    o = 4 * tokens
    fields["cu_seqlens"] = buffer[o : o + rows + 1]
    o += rows + 1
    for i, name in enumerate(_SEQ_FIELDS):
        fields[name] = buffer[o + i * rows : o + (i + 1) * rows]
    return StepTensors(**fields)
