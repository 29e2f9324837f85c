"""Step shapes: how a ragged batch is padded so that CUDA graphs can be reused.

A graph is captured for one static shape. Real batches are padded up to a bucket: the token count to a
multiple of 64 (up to 1024 tokens) or 256 (above), the sequence count to a power of two, and the longest
sequence (which sizes the attention kernel's grid) to a power of two. Padding tokens form one extra
"dummy" sequence (all at position 0), so that every token in the padded batch belongs to a well-defined
sequence, and padding sequences beyond it are empty. A batch of equal-length sequences that already fills its token
bucket keeps its exact shape ("dense"), which lets dense attention kernels (cuDNN) run on it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SMALL_TOKEN_STEP = 64
LARGE_TOKEN_STEP = 256
SMALL_TOKEN_LIMIT = 1024
MIN_MAXLEN_BUCKET = 64


@dataclass(frozen=True)
class StepShape:
    """The static shape one model run is launched with (the CUDA graph key when graphable)."""

    num_seqs: int  # rows of the padded batch: real sequences, then the dummy, then empty ones
    num_tokens: int  # tokens of the padded batch
    max_seqlen: int  # upper bound of any row's length, passed to the attention kernel
    dense_len: int  # > 0 when every row has exactly this many tokens (no padding at all)
    graphable: bool  # False: run eagerly with this exact shape


def token_bucket(num_tokens: int) -> int:
    step = SMALL_TOKEN_STEP if num_tokens <= SMALL_TOKEN_LIMIT else LARGE_TOKEN_STEP
    return max(step, -(-num_tokens // step) * step)


def seq_bucket(num_seqs: int) -> int:
    return 1 << max(0, (num_seqs - 1).bit_length())


def maxlen_bucket(max_len: int, num_tokens: int) -> int:
    return min(num_tokens, max(MIN_MAXLEN_BUCKET, 1 << max(0, (max_len - 1).bit_length())))


def token_buckets(max_tokens: int) -> list[int]:
    """Every token bucket up to max_tokens, smallest first."""
    out: list[int] = []
    size = token_bucket(1)
    while size <= max_tokens:
        out.append(size)
        size = token_bucket(size + 1)
    return out


def plan_shape(seq_lens: np.ndarray, graph_max_tokens: int, graph_max_seqs: int) -> StepShape:
    """Choose the padded shape of a batch; graph_max_* = 0 turns graphs off (exact shapes)."""
    num_seqs = int(seq_lens.shape[0])
    num_tokens = int(seq_lens.sum())
    longest = int(seq_lens.max())
    uniform = bool((seq_lens == longest).all())
    if graph_max_tokens > 0:
        bucket = token_bucket(num_tokens)
        if uniform and bucket == num_tokens and num_tokens <= graph_max_tokens and num_seqs <= graph_max_seqs:
            return StepShape(num_seqs, num_tokens, longest, longest, True)
        pad = bucket - num_tokens
        rows = seq_bucket(num_seqs + (1 if pad else 0))
        if bucket <= graph_max_tokens and rows <= graph_max_seqs:
            return StepShape(rows, bucket, maxlen_bucket(max(longest, pad), bucket), 0, True)
    return StepShape(num_seqs, num_tokens, longest, longest if uniform else 0, False)
