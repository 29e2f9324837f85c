"""Step shapes: how a ragged batch is padded so that a bounded, known set of CUDA graphs covers it.

A graph is captured for one static shape, and every graph is captured at start-up (startup.capture_graphs),
so the set must be small and known in advance. A shape is keyed by three coarse classes:

- the token bucket: the token count rounded up to a multiple of 64 (up to 1024), then of 256;
- the row class: the rows (sequences, plus one dummy row holding the padding tokens) rounded up to
  2, 8, 32, 128, then the engine's row cap (max_batch_seqs + 1); unused rows are empty;
- the length class: the longest row rounded up to 512, 2048, 8192, ... (each four times the last) or to
  the bucket (capped by the longest row the model can have), the bound handed to the attention kernel as
  max_seqlen.

Sequence count, offsets and lengths travel in the static input buffer (inputs.py), not in the key. Why
not the token bucket alone: varlen attention's grid is rows x ceil(max_seqlen / 128) x heads, and blocks
beyond a row's end still launch. With the row cap (257) and max_seqlen = bucket, one 4096-token row
took 0.62 ms per attention call instead of 0.39, eight 512-token rows in a 4096 bucket 0.23 instead of
0.06 (H200, Qwen3-0.6B heads, bench/engine/varlen_bound.py); over 28 layers that is 6.5 and 4.6 ms per
step. The classes keep the waste within a factor of four in rows and in length while the key space stays
bounded. With only 512 and the bucket as length classes, fourteen scoring pairs of 532 tokens in a
7,680-token bucket ran XLM-R's attention at 0.130 ms a call, 0.107 with a 2,048 bound, 0.097 tight (H100,
varlen_bound.py): 0.55 ms a step over 24 layers, hence the classes between. graph_shapes() lists every
shape plan_shape() can return, plus one exact-length single-row ("dense") shape per bucket, where cuDNN
attention runs about twice as fast as varlen (0.21 against 0.39 ms at 4096 tokens): 500 graphs for the
pplx-embed / Qwen3-0.6B shape and for XLM-R large with graphs up to 8192 tokens (456 + 44 dense; 396
without the 2,048 class; XLM-R's captured in 10.9-12.8 s on an H100, 9.4-9.6 s for the 396), 182 for
all-MiniLM-L6-v2 (174 + 8; its rows stop at 512). Batches above graph_max_tokens run eagerly: they take
tens of milliseconds on the GPU, so launching their kernels one by one costs little.

Padding tokens form one extra dummy row (all at position 0) so that every token of the padded batch
belongs to a row; the dummy is shorter than LARGE_TOKEN_STEP, so it never raises the length class.

Eager steps of rows of different lengths are padded to their token bucket too, where the limits allow
it (eager_pad_tokens: on a GPU), so that they come in a bounded set of token counts. A step at a token
count the process has never run is slower: in a stream of unequal-row steps of 8,193-16,384 tokens, each
at a new count, an H100 ran 605-647 tokens/ms of XLM-R large against 745-768 once every count had run
before, and 405-413 against 474 for Qwen3-0.6B (bench/engine/new_token_counts.py; cuBLAS choosing its
algorithm for each new product shape is the likely cause, not established). Padded, the same streams ran
717-732 and 462-463 either way: where exact counts repeat, the padding costs 2-5 % (its tokens, and
products at multiples of 256 rows that run up to 8 % slower per row than at the counts beside them).
Steps of equal rows keep their exact shape: they run as dense rows (cuDNN), which the dummy would break;
until the engine's dense-step thread has set their shape up, off the requests' path, the engine runs them
as padded_shape pads them (Engine._met_shape, dense_steps.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SMALL_TOKEN_STEP = 64
LARGE_TOKEN_STEP = 256
SMALL_TOKEN_LIMIT = 1024
ROW_CLASS_BASE = 2  # one sequence and the dummy row
ROW_CLASS_FACTOR = 4
SMALLEST_LENGTH_CLASS = 512
LENGTH_CLASS_FACTOR = 4
DEFAULT_GRAPH_MAX_TOKENS = 8192


@dataclass(frozen=True)
class StepShape:
    """The static shape one model run is launched with (the CUDA graph key when graphable)."""

    num_seqs: int  # rows of the padded batch: real sequences, then the dummy, then empty ones
    num_tokens: int  # tokens of the padded batch
    max_seqlen: int  # upper bound of any row's length, passed to the attention kernel
    dense_len: int  # > 0 when every row has exactly this many tokens (no padding at all)
    graphable: bool  # False: run eagerly with this exact shape


@dataclass(frozen=True)
class GraphLimits:
    """What the graph set covers; max_tokens = 0 turns graphs off (every step runs at its exact shape)."""

    max_tokens: int
    max_rows: int  # rows of the largest padded batch: max_batch_seqs + 1 (the dummy)
    max_row_len: int  # the longest real row the model takes (its max input length)
    eager_pad_tokens: int = 0  # eager steps of unequal rows padded to their token bucket up to this size

    @property
    def length_cap(self) -> int:
        return max(self.max_row_len, LARGE_TOKEN_STEP)


NO_GRAPHS = GraphLimits(0, 0, 0)


def token_bucket(num_tokens: int) -> int:
    step = SMALL_TOKEN_STEP if num_tokens <= SMALL_TOKEN_LIMIT else LARGE_TOKEN_STEP
    return max(step, -(-num_tokens // step) * step)


def token_buckets(max_tokens: int) -> list[int]:
    """Every token bucket up to max_tokens, smallest first."""
    out: list[int] = []
    size = token_bucket(1)
    while size <= max_tokens:
        out.append(size)
        size = token_bucket(size + 1)
    return out


def _classes_up_to(first: int, factor: int, cap: int) -> tuple[int, ...]:
    """first, first * factor, ... while below cap, then cap."""
    out: list[int] = []
    size = first
    while size < cap:
        out.append(size)
        size *= factor
    return (*out, cap)


def row_classes(bucket: int, limits: GraphLimits) -> tuple[int, ...]:
    """The row classes of a token bucket, smallest first (a bucket of B tokens holds at most B rows)."""
    return _classes_up_to(ROW_CLASS_BASE, ROW_CLASS_FACTOR, min(limits.max_rows, bucket))


def length_classes(bucket: int, limits: GraphLimits) -> tuple[int, ...]:
    """The length classes of a token bucket, smallest first."""
    return _classes_up_to(SMALLEST_LENGTH_CLASS, LENGTH_CLASS_FACTOR, min(bucket, limits.length_cap))


def _class_of(value: int, classes: tuple[int, ...]) -> int:
    return next(size for size in classes if size >= value)


def plan_shape(seq_lens: np.ndarray, limits: GraphLimits) -> StepShape:
    """Choose the padded shape of a batch: a graph shape when it fits the limits, else its exact shape."""
    lens = seq_lens.tolist()  # Python ints: at a step's few rows, faster than numpy's reductions
    num_seqs = len(lens)
    num_tokens = sum(lens)
    longest = max(lens)
    bucket = token_bucket(num_tokens)
    if limits.max_tokens > 0 and bucket <= limits.max_tokens and longest <= limits.length_cap:
        if num_seqs == 1 and longest == bucket:
            return StepShape(1, bucket, bucket, bucket, True)
        pad = bucket - num_tokens
        rows = num_seqs + (1 if pad else 0)
        if rows <= limits.max_rows:
            return StepShape(_class_of(rows, row_classes(bucket, limits)), bucket,
                             _class_of(max(longest, pad), length_classes(bucket, limits)), 0, True)
    # Rows of one length (a throughput batch, equal documents) run as dense rows: on an H200, cuDNN's dense
    # attention took 0.82 against FlashAttention-2's 1.57 ms a layer for Qwen3 at 4 x 4096 tokens.
    if min(lens) == longest:
        return StepShape(num_seqs, num_tokens, longest, longest, False)
    return _eager_ragged(num_seqs, num_tokens, longest, limits)


def padded_shape(seq_lens: np.ndarray, limits: GraphLimits) -> StepShape:
    """The eager shape of a batch above the graphs as ragged rows padded to their token bucket, even when
    its rows are all of one length (where plan_shape would run them dense, at their exact shape)."""
    lens = seq_lens.tolist()
    return _eager_ragged(len(lens), sum(lens), max(lens), limits)


def _eager_ragged(num_seqs: int, num_tokens: int, longest: int, limits: GraphLimits) -> StepShape:
    bucket = token_bucket(num_tokens)
    if bucket <= limits.eager_pad_tokens and bucket > num_tokens:
        return StepShape(num_seqs + 1, bucket, max(longest, bucket - num_tokens), 0, False)
    return StepShape(num_seqs, num_tokens, longest, 0, False)


def bucket_filling_lens(bucket: int, max_row_len: int, max_rows: int) -> list[int] | None:
    """Row lengths of a ragged batch one token short of bucket (so that the dummy row pads it to the bucket,
    as a request's step would be): rows of 512 tokens or longer where the row cap needs it, at most
    max_row_len; None when no batch of at most max_rows rows reaches the bucket."""
    tokens = bucket - 1
    row = min(max_row_len, max(SMALLEST_LENGTH_CLASS, -(-tokens // max_rows)))
    if row * max_rows < tokens:
        return None
    full, rest = divmod(tokens, row)
    return [row] * full + ([rest] if rest else [])


def dense_priming_lens(limits: GraphLimits, max_row_len: int, max_tokens: int, max_rows: int) -> list[list[int]]:
    """Row lengths of the smallest dense steps above the graphs, one with rows of 512 tokens (or the longest
    row, if shorter) and one with rows a token shorter, so that one token count is divisible by 16 and the
    other is not (Engine.prime_dense_steps); each within the step budget and the row cap."""
    length = min(SMALLEST_LENGTH_CLASS, max_row_len, max_tokens)
    batches = []
    for row_len in dict.fromkeys((length, max(1, length - 1))):
        rows = max(1, min(limits.max_tokens // row_len + 1, max_tokens // row_len, max_rows))
        batches.append([row_len] * rows)
    return batches


def first_sight_key(shape: StepShape) -> tuple[int, int, int]:
    """What an eager step's kernels set themselves up for at first sight of a shape: the token count (the
    products' rows, for which cuBLAS picks an algorithm; the Triton kernels' row count, which they are
    compiled specialised on, divisible by 16 or not) and, for dense rows, their count and length (cuDNN's
    attention plan). Ragged attention (FlashAttention-2's varlen kernel, the Triton kernel) sets nothing up
    per shape."""
    return (shape.num_tokens, shape.dense_len, shape.num_seqs if shape.dense_len else 0)


def graph_shapes(limits: GraphLimits) -> list[StepShape]:
    """Every shape plan_shape can return as graphable under these limits: the graphs to capture.

    A padded batch of B tokens in r rows whose longest row is m exists iff m + (r - 1) <= B <= r * m,
    so (bucket, row class, length class) is reachable iff the class's smallest row count and length
    fit into B and its largest ones can fill it.
    """
    if limits.max_tokens <= 0:
        return []
    shapes: list[StepShape] = []
    for bucket in token_buckets(limits.max_tokens):
        if bucket <= limits.max_row_len:
            shapes.append(StepShape(1, bucket, bucket, bucket, True))
        fewer_rows = 0
        for rows in row_classes(bucket, limits):
            shorter = 0
            for length in length_classes(bucket, limits):
                if (shorter + 1) + fewer_rows <= bucket <= rows * length:
                    shapes.append(StepShape(rows, bucket, length, 0, True))
                shorter = length
            fewer_rows = rows
    return shapes


def example_lens(shape: StepShape, max_row_len: int) -> list[int]:
    """Row lengths of a batch for capturing a graph shape: rows as long as the shape and the model allow,
    filling it; where real rows cannot (a class reached only with the dummy row), padding fills the rest."""
    row = min(shape.max_seqlen, max_row_len)
    full, rest = divmod(shape.num_tokens, row)
    lens = [row] * full + ([rest] if rest else [])
    return lens if len(lens) <= shape.num_seqs else lens[: shape.num_seqs - 1]
