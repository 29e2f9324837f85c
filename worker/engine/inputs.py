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

    use_token_types=False writes zeros as token types (RoBERTa-family models take none).
    """
    n, t = batch.num_seqs, batch.num_tokens
    rows, tokens = shape.num_seqs, shape.num_tokens
    lens = np.zeros(rows, dtype=np.int64)
    lens[:n] = batch.seq_lens
    if tokens > t:
        lens[n] = tokens - t
    cu = np.full(rows + 1, tokens, dtype=np.int64)  # the padding row ends at `tokens`, empty rows after it too
    cu[: n + 1] = batch.offsets

    size = packed_size(rows, tokens)
    buf = out[:size]
    ids, pos, types, seq_ids = (buf[i * tokens : (i + 1) * tokens] for i in range(4))
    ids[:t] = batch.input_ids
    ids[t:] = 0
    seq_ids[:] = np.repeat(np.arange(rows, dtype=np.int32), lens)
    pos[:] = np.arange(tokens, dtype=np.int64) - cu[:-1][seq_ids]
    pos[t:] = 0  # padding tokens all sit at position 0: no row may reach past the model's position table
    if batch.token_type_ids is None or not use_token_types:
        types[:] = 0
    else:
        types[:t] = batch.token_type_ids
        types[t:] = 0
    o = 4 * tokens
    buf[o : o + rows + 1] = cu
    o += rows + 1
    first, last, seq_lens, normalize = (buf[o + i * rows : o + (i + 1) * rows] for i in range(4))
    first[:] = np.minimum(cu[:-1], tokens - 1)
    last[:] = np.clip(cu[1:] - 1, 0, tokens - 1)
    seq_lens[:] = lens
    normalize[:] = 0
    if batch.normalize is not None:
        normalize[:n] = np.asarray(batch.normalize, dtype=bool)
    return size


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
