"""Attention on ragged rows in one hand-written Triton kernel (FlashAttention's online softmax).

Why: the graphs' steps run FlashAttention-2 on ragged rows (aten's op), which on an H100 took 1.5 times
cuDNN's dense kernel on the same rows for XLM-R's heads (64 wide) and twice for Qwen3's (128 wide, two query
heads a key head): 0.142 against 0.090 ms for 32 rows of 512 tokens, 0.392 against 0.203 ms for one row of
4,096. cuDNN's dense kernel needs rows of one length, and its ragged form cannot be captured in a CUDA graph
(torch 2.11). This kernel takes the rows' offsets from cu_seqlens on the device, so a graph replays it for
whatever lengths are written into its static buffer. On that H100 it took 0.52-0.87 of FlashAttention-2's
time at every case measured, ragged or not; for XLM-R's heads it beat cuDNN's dense kernel at one row of
500 tokens and 14 of 532, and took 1.03 and 1.10 of its time at 6 and 32 rows of 512 (bench/RESULTS.md).
The selector (attention_select.py) times it beside the others at start-up and takes it where it is fastest.

One program computes BLOCK_M queries of one row and one head (or of HEADS heads that share a key head)
against every key of that row (or, causal, every key up to its last query), in blocks of BLOCK_N keys. The
grid is (query blocks of the longest row allowed, rows x heads / HEADS); a program past its row's end
returns at once, so a graph's bound costs a launch per block, not its work. Query heads share a key head
GROUPS to one (GQA) by reading it, not copying it.
q, k and v are read through their strides: the models hand in views of one fused projection output.
Scores and the softmax are float32; probabilities are rounded to the inputs' dtype for the second product,
as FlashAttention does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class AttentionTile:
    """A program's queries and keys per block, its warps and its software-pipeline stages, and the query heads
    it takes together: heads > 1 stacks that many heads that share a key head (GQA) into one tile of
    heads x block_m queries, so each block of keys is read once for all of them (a power of two dividing
    the model's query heads per key head; otherwise one head a program)."""

    block_m: int
    block_n: int
    warps: int
    stages: int
    heads: int = 1


# 64 queries x 64 keys, 4 warps, 3 stages: the fastest of eight tiles at 16 of the 20 cases of
# bench/engine/attention_tiles.py (XLM-R's heads, 64 wide, and Qwen3's, 128), within 3 % at the other four,
# on an H100 (bench/RESULTS.md). Wider heads take fewer stages, for shared memory.
DEFAULT_TILE = AttentionTile(64, 64, 4, 3)
WIDE_HEAD_TILE = AttentionTile(64, 64, 4, 2)


def tile_for(head_dim: int) -> AttentionTile:
    return DEFAULT_TILE if head_dim <= 128 else WIDE_HEAD_TILE


@triton.jit
def _attend_block(acc, row_sum, row_max, q, k_rows, v_rows, key0, keys, queries, key_stride, v_stride,
                  scale_log2, MASKED: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_N: tl.constexpr):
    """Fold keys key0 .. key0 + BLOCK_N of one row into the running (acc, row_sum, row_max)."""
    offs_n = key0 + tl.arange(0, BLOCK_N)
    if MASKED:
        in_row = offs_n < keys
        k = tl.load(k_rows + offs_n[:, None] * key_stride, mask=in_row[:, None], other=0.0)
        v = tl.load(v_rows + offs_n[:, None] * v_stride, mask=in_row[:, None], other=0.0)
    else:
        k = tl.load(k_rows + offs_n[:, None] * key_stride)
        v = tl.load(v_rows + offs_n[:, None] * v_stride)
    scores = tl.dot(q, tl.trans(k)).to(tl.float32) * scale_log2
    if MASKED:
        allowed = in_row[None, :]
        if CAUSAL:
            allowed = allowed & (offs_n[None, :] <= queries[:, None])
        scores = tl.where(allowed, scores, float("-inf"))
    new_max = tl.maximum(row_max, tl.max(scores, 1))
    p = tl.math.exp2(scores - new_max[:, None])
    rescale = tl.math.exp2(row_max - new_max)
    row_sum = row_sum * rescale + tl.sum(p, 1)
    acc = acc * rescale[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
    return acc, row_sum, new_max


@triton.jit
def _varlen_attention(q_ptr, k_ptr, v_ptr, out_ptr, cu_seqlens_ptr,
                      q_stride, q_head_stride, k_stride, k_head_stride, v_stride, v_head_stride,
                      out_stride, out_head_stride, scale_log2,
                      NUM_HEADS: tl.constexpr, GROUPS: tl.constexpr, HEAD_DIM: tl.constexpr,
                      CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEADS: tl.constexpr):
    block = tl.program_id(0)
    row_heads = tl.program_id(1)
    row = row_heads // (NUM_HEADS // HEADS)
    first_head = (row_heads % (NUM_HEADS // HEADS)) * HEADS
    start = tl.load(cu_seqlens_ptr + row).to(tl.int64)
    length = (tl.load(cu_seqlens_ptr + row + 1) - start).to(tl.int32)
    first = block * BLOCK_M
    if first >= length:
        return
    lanes = tl.arange(0, HEADS * BLOCK_M)  # head-major: HEADS runs of BLOCK_M queries
    queries = first + lanes % BLOCK_M
    heads = first_head + lanes // BLOCK_M
    dims = tl.arange(0, HEAD_DIM)
    q_in_row = queries < length
    q = tl.load(q_ptr + (start + queries)[:, None] * q_stride + heads[:, None] * q_head_stride + dims[None, :],
                mask=q_in_row[:, None], other=0.0)
    kv_head = first_head // GROUPS
    k_rows = k_ptr + start * k_stride + kv_head * k_head_stride + dims[None, :]
    v_rows = v_ptr + start * v_stride + kv_head * v_head_stride + dims[None, :]
    acc = tl.zeros([HEADS * BLOCK_M, HEAD_DIM], dtype=tl.float32)
    row_sum = tl.zeros([HEADS * BLOCK_M], dtype=tl.float32)
    row_max = tl.full([HEADS * BLOCK_M], float("-inf"), dtype=tl.float32)
    keys = length
    if CAUSAL:
        keys = tl.minimum(length, first + BLOCK_M)
        unmasked_end = (first // BLOCK_N) * BLOCK_N  # blocks wholly at or before the first query
    else:
        unmasked_end = (length // BLOCK_N) * BLOCK_N
    for key0 in range(0, unmasked_end, BLOCK_N):
        acc, row_sum, row_max = _attend_block(acc, row_sum, row_max, q, k_rows, v_rows, key0, keys, queries,
                                              k_stride, v_stride, scale_log2, False, CAUSAL, BLOCK_N)
    for key0 in range(unmasked_end, keys, BLOCK_N):
        acc, row_sum, row_max = _attend_block(acc, row_sum, row_max, q, k_rows, v_rows, key0, keys, queries,
                                              k_stride, v_stride, scale_log2, True, CAUSAL, BLOCK_N)
    out = acc / row_sum[:, None]
    tl.store(out_ptr + (start + queries)[:, None] * out_stride + heads[:, None] * out_head_stride + dims[None, :],
             out.to(out_ptr.dtype.element_ty), mask=q_in_row[:, None])


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                     scale: float, causal: bool, tile: AttentionTile | None = None) -> torch.Tensor:
    """Attention of each row of q [T, H, D] to the same row of k and v [T, Hkv, D]; rows from cu_seqlens
    (int32 [S + 1], on the device); max_seqlen bounds every row's length (the launch grid, not the work)."""
    tokens, heads, head_dim = q.shape
    if head_dim & (head_dim - 1) or head_dim < 16:
        raise ValueError(f"head width {head_dim}: the kernel takes powers of two from 16")
    if heads % k.shape[1]:
        raise ValueError(f"{heads} query heads do not share {k.shape[1]} key heads evenly")
    if not all(x.stride(-1) == 1 for x in (q, k, v)):
        raise ValueError("each head's values must be contiguous")
    tile = tile or tile_for(head_dim)
    out = torch.empty((tokens, heads, head_dim), device=q.device, dtype=q.dtype)
    rows = cu_seqlens.shape[0] - 1
    if tokens == 0 or rows == 0 or max_seqlen == 0:
        return out
    groups = heads // k.shape[1]
    heads_per_program = tile.heads if groups % tile.heads == 0 and not tile.heads & (tile.heads - 1) else 1
    grid = (triton.cdiv(max_seqlen, tile.block_m), rows * heads // heads_per_program)
    _varlen_attention[grid](
        q, k, v, out, cu_seqlens,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        scale * math.log2(math.e),
        NUM_HEADS=heads, GROUPS=groups, HEAD_DIM=head_dim, CAUSAL=causal, BLOCK_M=tile.block_m,
        BLOCK_N=tile.block_n, HEADS=heads_per_program, num_warps=tile.warps, num_stages=tile.stages,
    )
    return out
