"""A split-K Triton GEMM for short steps (up to 512 tokens): the alternative to cuBLAS that gemm_bench times.

At a few hundred tokens a product is bound by reading its weight, and cuBLAS tiles the output only: at
128 tokens a 1024-wide output is 8 to 16 tiles of 64-128 columns. Here the output is tiled finely and
the inner dimension can be split as well, so that about as many programs as SMs stream a slice of the
weight each. The programs of one output tile write float32 partial sums to a workspace; the last of them
to arrive (a per-tile arrival counter) adds the slices in split order, so the result does not depend on
the arrival order, writes the output and resets the counter, so the kernel can be replayed in a CUDA
graph.

Measured on an H100 (bench/RESULTS.md, 2026-12-05, night): the fastest plan of each shape takes 0.99-1.16
times cuBLAS's time at M = 64 and 1.08-1.29 times at 512, and a split plan is the fastest only for the
1,024-wide outputs at M <= 256. A product there costs a fixed few microseconds per kernel whatever reads
the weight, so the engine keeps cuBLAS and this kernel stays a benchmark.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

WORKSPACE_BYTES = 32 * 2**20
MAX_TILES = 4096  # arrival counters: output tiles of the largest split product


@dataclass(frozen=True)
class GemmPlan:
    """How one product shape runs: output tiles of block_m x block_n, the inner dimension in `split`
    slices stepped block_k at a time."""

    block_m: int
    block_n: int
    block_k: int
    split: int
    stages: int
    warps: int

    def tiles(self, m: int, n: int) -> int:
        return triton.cdiv(m, self.block_m) * triton.cdiv(n, self.block_n)

    def fits(self, m: int, n: int, k: int) -> bool:
        """Whether this plan can run the shape: the slices cover K exactly, and a split product's
        partial sums and counters fit the workspace."""
        if k % (self.split * self.block_k):
            return False
        if self.split == 1:
            return True
        tiles = self.tiles(m, n)
        return tiles <= MAX_TILES and self.split * tiles * self.block_m * self.block_n * 4 <= WORKSPACE_BYTES


@triton.jit
def _write(acc, out_ptr, rows, cols, M, N):
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    tl.store(out_ptr + rows[:, None].to(tl.int64) * N + cols[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _split_k_kernel(
    x_ptr, w_ptr, out_ptr, partial_ptr, arrivals_ptr, M, N, K, x_row_stride, k_per_split,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    tile = tl.program_id(0)
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    tiles_m = tl.cdiv(M, BLOCK_M)
    # Row tiles vary fastest: the programs that read the same slice of the weight run side by side.
    tile_m = tile % tiles_m
    tile_n = tile // tiles_m
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    inner = split * k_per_split + tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows[:, None].to(tl.int64) * x_row_stride + inner[None, :]
    w_ptrs = w_ptr + cols[None, :].to(tl.int64) * K + inner[:, None]
    row_ok = (rows < M)[:, None]
    col_ok = (cols < N)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in tl.range(0, k_per_split, BLOCK_K):
        x = tl.load(x_ptrs, mask=row_ok, other=0.0)
        w = tl.load(w_ptrs, mask=col_ok, other=0.0)
        acc = tl.dot(x, w, acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if splits == 1:
        _write(acc, out_ptr, rows, cols, M, N)
    else:
        num_tiles = tl.num_programs(0)
        block = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        tl.store(partial_ptr + (split * num_tiles + tile).to(tl.int64) * (BLOCK_M * BLOCK_N) + block, acc,
                 cache_modifier=".cg")
        # Every thread's partial sums are written before one thread announces them (release); the
        # last arrival's threads read them after its acquire, from L2 (.cg), never from a stale L1.
        tl.debug_barrier()
        arrived = tl.atomic_add(arrivals_ptr + tile, 1, sem="acq_rel")
        if arrived == splits - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for part in range(0, splits):
                total += tl.load(partial_ptr + (part * num_tiles + tile).to(tl.int64) * (BLOCK_M * BLOCK_N) + block,
                                 cache_modifier=".cg")
            tl.atomic_xchg(arrivals_ptr + tile, 0)
            _write(total, out_ptr, rows, cols, M, N)


class SplitKGemm:
    """The kernel's workspace and arrival counters (used by one stream at a time)."""

    def __init__(self, device: torch.device) -> None:
        self.partials = torch.empty(WORKSPACE_BYTES // 4, dtype=torch.float32, device=device)
        self.arrivals = torch.zeros(MAX_TILES, dtype=torch.int32, device=device)

    def run(self, plan: GemmPlan, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x @ weight.T with this plan (plan.fits must hold for the shape)."""
        k = x.shape[-1]
        rows = x.reshape(-1, k)
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        m, n = rows.shape[0], weight.shape[0]
        if not weight.is_contiguous():
            raise ValueError("the split-K product needs a row-major weight")
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
        _split_k_kernel[(plan.tiles(m, n), plan.split)](
            rows, weight, out, self.partials, self.arrivals, m, n, k, rows.stride(0), k // plan.split,
            BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_K=plan.block_k,
            num_stages=plan.stages, num_warps=plan.warps,
        )
        return out.view(*x.shape[:-1], n)


def candidate_plans(m: int, n: int, k: int, sms: int) -> list[GemmPlan]:
    """The plans timed for one shape: a few block shapes, each with the splits that bring its
    programs from under one wave of SMs to about two (no split when the output tiles fill the SMs)."""
    plans = []
    for block_m, block_n, block_k, stages, warps in BLOCKS:
        if block_m > 64 and m <= 64:
            continue
        base = GemmPlan(block_m, block_n, block_k, 1, stages, warps)
        tiles = base.tiles(m, n)
        split = 1
        while True:
            plan = GemmPlan(block_m, block_n, block_k, split, stages, warps)
            if not plan.fits(m, n, k):
                break
            plans.append(plan)
            if tiles * split >= sms:
                break
            split *= 2
    return plans


# (block_m, block_n, block_k, stages, warps)
BLOCKS = [(64, 64, 128, 4, 4), (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (128, 128, 64, 3, 8),
          (64, 32, 128, 5, 4)]
