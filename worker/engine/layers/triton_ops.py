"""Hand-written Triton kernels for the elementwise units of fused.py, one pass over memory each.

Each function computes what its plain PyTorch counterpart in fused.py computes, with the same roundings
to the activation dtype at the same places (so bf16 results agree to about one unit in the last place),
but reads its inputs once and writes its outputs once. Every size other than the token count is a
compile-time constant. A row norm's program takes a few rows (tokens) of a long step and one row of a
short step, so that every SM gets programs; so a kernel compiles once for each rows-per-program it uses (a
few), not per token count or CUDA graph bucket. A norm's rows and warps per program are a `Tile`; the q/k
kernel's program takes a group of one token's heads. The defaults follow what
`python -m quiver.bench.engine.tile_bench` measured. Under TRITON_INTERPRET=1 the same kernels run on CPU
tensors; all arithmetic is written on float32 values with explicit rounding (the interpreter mis-adds bf16
directly).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

NORM_ROWS = 4
QK_HEADS = 8  # a q/k program's heads
TOKENS_PER_ROW_STEP = 512  # rows per program double at every such many tokens (2 from 1,024, 4 from 2,048)


@dataclass(frozen=True)
class Tile:
    """A row norm's launch: rows (tokens) per program and warps per program."""

    rows: int
    warps: int

    def __post_init__(self) -> None:
        if any(n < 1 or n & (n - 1) for n in (self.rows, self.warps)) or self.warps > 32:
            raise ValueError(f"{self}: rows and warps must be powers of two, warps at most 32")


def _row_major(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, last dim] with unit column stride (a view where it can be; rows may be strided)."""
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def row_warps(block: int) -> int:
    """Warps for a row of `block` elements: about 8 elements (16 bytes of bf16) per thread."""
    return max(1, min(16, block // 256))


def _rows_per_program(tokens: int, most: int) -> int:
    """Rows a program takes: `most`, but one while there are too few tokens to give every SM a few programs
    (a short step is latency-bound, and fewer programs would leave SMs idle)."""
    rows = 1
    while rows < most and tokens >= 2 * rows * TOKENS_PER_ROW_STEP:
        rows *= 2
    return rows


def _norm_tile(tokens: int, block: int) -> Tile:
    """A row norm's default: up to NORM_ROWS rows of `block` elements per program, the warps of one row
    (more warps for more rows measured slower)."""
    return Tile(_rows_per_program(tokens, NORM_ROWS), row_warps(block))


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, summed_ptr, n_rows, x_row_stride, eps,
    N: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    mask = (rows < n_rows) & (cols < N)
    x = tl.load(x_ptr + rows * x_row_stride + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + rows * N + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + residual.to(tl.float32)).to(x.dtype)
        tl.store(summed_ptr + rows * N + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(xf * xf, axis=1) / N + eps)[:, None]
    normed = (xf * rstd).to(x.dtype).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows * N + cols, (weight * normed).to(out_ptr.dtype.element_ty), mask=mask)


def _launch_rms_norm(rows: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                     tile: Tile | None) -> tuple[torch.Tensor, torch.Tensor]:
    n = rows.shape[-1]
    out = torch.empty(rows.shape, dtype=rows.dtype, device=rows.device)
    summed = torch.empty(rows.shape, dtype=rows.dtype, device=rows.device) if residual is not None else out
    if rows.shape[0]:
        block = triton.next_power_of_2(n)
        tile = tile or _norm_tile(rows.shape[0], block)
        _add_rms_norm_kernel[(triton.cdiv(rows.shape[0], tile.rows),)](
            rows, residual if residual is not None else rows, weight, out, summed, rows.shape[0], rows.stride(0),
            eps, N=n, BLOCK=block, ROWS=tile.rows, HAS_RESIDUAL=residual is not None, num_warps=tile.warps,
        )
    return out, summed


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, tile: Tile | None = None) -> torch.Tensor:
    out, _ = _launch_rms_norm(_row_major(x), None, weight, eps, tile)
    return out.view(x.shape)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, tile: Tile | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) in one pass: two reads, two writes per element."""
    out, summed = _launch_rms_norm(_row_major(x), residual.reshape(-1, x.shape[-1]).contiguous(), weight, eps, tile)
    return out.view(x.shape), summed.view(x.shape)


@triton.jit
def _qk_norm_rope_kernel(
    qkv_ptr, weight_ptr, cos_ptr, sin_ptr, positions_ptr, out_ptr, qkv_row_stride, eps,
    HEADS: tl.constexpr, GROUP: tl.constexpr, HALF: tl.constexpr,
):
    """One token's GROUP of q and k heads: RMS-normalise each head over head_dim = 2 * HALF, then rotate halves."""
    token = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * GROUP + tl.arange(0, GROUP)[:, None]
    cols = tl.arange(0, HALF)[None, :]
    mask = heads < HEADS
    offsets = heads * (2 * HALF) + cols
    src = qkv_ptr + token * qkv_row_stride + offsets
    x1 = tl.load(src, mask=mask, other=0.0)
    x2 = tl.load(src + HALF, mask=mask, other=0.0)
    x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
    rstd = tl.rsqrt((tl.sum(x1f * x1f, axis=1) + tl.sum(x2f * x2f, axis=1)) / (2 * HALF) + eps)[:, None]
    w1 = tl.load(weight_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    w2 = tl.load(weight_ptr + offsets + HALF, mask=mask, other=0.0).to(tl.float32)
    # The same roundings as the plain path: the normalised value, then weight * normalised, in x's dtype.
    y1 = (w1 * (x1f * rstd).to(x1.dtype).to(tl.float32)).to(x1.dtype).to(tl.float32)
    y2 = (w2 * (x2f * rstd).to(x1.dtype).to(tl.float32)).to(x1.dtype).to(tl.float32)
    position = tl.load(positions_ptr + token).to(tl.int64)
    cos = tl.load(cos_ptr + position * HALF + cols)
    sin = tl.load(sin_ptr + position * HALF + cols)
    dst = out_ptr + token * (HEADS * 2 * HALF) + offsets
    tl.store(dst, (y1 * cos - y2 * sin).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, (y2 * cos + y1 * sin).to(out_ptr.dtype.element_ty), mask=mask)


def qk_norm_rope(
    qkv: torch.Tensor,
    qk_weight: torch.Tensor,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    positions: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    eps: float,
    heads_per_program: int = QK_HEADS,
    warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fused.qk_norm_rope in one kernel: q and k heads normalised and rotated into one [T, H + Hkv, D].

    A program takes one token's `heads_per_program` heads (a power of two): with all of a token's heads in
    one program, Qwen3's 24 would be padded to 32 lanes' worth of work."""
    tokens = qkv.shape[0]
    heads = num_heads + num_kv_heads
    head_dim = qk_weight.shape[1]
    if qkv.stride(1) != 1 or head_dim % 2 or head_dim & (head_dim - 1):
        raise ValueError("qk_norm_rope needs a row-major qkv and a power-of-two head_dim")
    qk = torch.empty((tokens, heads, head_dim), dtype=qkv.dtype, device=qkv.device)
    if tokens:
        group = min(heads_per_program, triton.next_power_of_2(heads))
        _qk_norm_rope_kernel[(tokens, triton.cdiv(heads, group))](
            qkv, qk_weight, cos_table, sin_table, positions, qk, qkv.stride(0), eps,
            HEADS=heads, GROUP=group, HALF=head_dim // 2, num_warps=warps or row_warps(group * head_dim),
        )
    v = qkv[:, heads * head_dim :].view(tokens, num_kv_heads, head_dim)
    return qk[:, :num_heads], qk[:, num_heads:], v


_ACTIVATIONS = {
    "gelu": 0, "gelu_new": 1, "gelu_pytorch_tanh": 1, "gelu_fast": 1, "relu": 2, "silu": 3, "swish": 3,
}


@triton.jit
def _tanh(x):
    return 2.0 * tl.sigmoid(2.0 * x) - 1.0


@triton.jit
def _bias_activation_kernel(
    x_ptr, bias_ptr, out_ptr, x_row_stride,
    N: tl.constexpr, BLOCK: tl.constexpr, KIND: tl.constexpr, HAS_BIAS: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + bias.to(tl.float32)).to(x.dtype)
    xf = x.to(tl.float32)
    if KIND == 0:
        y = 0.5 * xf * (1.0 + tl.erf(xf * 0.7071067811865476))
    elif KIND == 1:
        y = 0.5 * xf * (1.0 + _tanh(0.7978845608028654 * (xf + 0.044715 * xf * xf * xf)))
    elif KIND == 2:
        y = tl.maximum(xf, 0.0)
    else:
        y = xf * tl.sigmoid(xf)
    tl.store(out_ptr + row * N + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def bias_activation(x: torch.Tensor, bias: torch.Tensor | None, kind: str) -> torch.Tensor:
    """activation(x + bias) (bias optional) in one pass; the bias add rounds to x's dtype first, as
    PyTorch's separate add would."""
    if kind not in _ACTIVATIONS:
        raise NotImplementedError(f"activation {kind!r} is not supported")
    n = x.shape[-1]
    rows = _row_major(x)
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        block = min(triton.next_power_of_2(n), 2048)
        _bias_activation_kernel[(rows.shape[0], triton.cdiv(n, block))](
            rows, bias if bias is not None else rows, out, rows.stride(0),
            N=n, BLOCK=block, KIND=_ACTIVATIONS[kind], HAS_BIAS=bias is not None,
            num_warps=row_warps(block),
        )
    return out.view(x.shape)


def activation(x: torch.Tensor, kind: str) -> torch.Tensor:
    return bias_activation(x, None, kind)


@triton.jit
def _silu_mul_kernel(gate_up_ptr, out_ptr, gate_up_row_stride, N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    gate = tl.load(gate_up_ptr + row * gate_up_row_stride + cols, mask=mask, other=0.0)
    up = tl.load(gate_up_ptr + row * gate_up_row_stride + N + cols, mask=mask, other=0.0)
    gf = gate.to(tl.float32)
    silu = (gf * tl.sigmoid(gf)).to(gate.dtype).to(tl.float32)
    tl.store(out_ptr + row * N + cols, (silu * up.to(tl.float32)).to(out_ptr.dtype.element_ty), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SwiGLU on a fused [T, 2 I] gate/up product: silu(gate) * up, [T, I]."""
    tokens, width = gate_up.shape
    n = width // 2
    if gate_up.stride(1) != 1:
        raise ValueError("silu_mul needs a row-major gate_up")
    out = torch.empty((tokens, n), dtype=gate_up.dtype, device=gate_up.device)
    if tokens:
        block = min(triton.next_power_of_2(n), 1024)
        _silu_mul_kernel[(tokens, triton.cdiv(n, block))](
            gate_up, out, gate_up.stride(0), N=n, BLOCK=block, num_warps=row_warps(block),
        )
    return out


@triton.jit
def _add_layer_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, bias_ptr, out_ptr, n_rows, eps,
    N: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    col_ok = cols < N
    mask = (rows < n_rows) & col_ok
    x = tl.load(x_ptr + rows * N + cols, mask=mask, other=0.0)
    residual = tl.load(residual_ptr + rows * N + cols, mask=mask, other=0.0)
    xf = (x.to(tl.float32) + residual.to(tl.float32)).to(x.dtype).to(tl.float32)
    mean = (tl.sum(xf, axis=1) / N)[:, None]
    centred = tl.where(col_ok, xf - mean, 0.0)
    rstd = tl.rsqrt(tl.sum(centred * centred, axis=1) / N + eps)[:, None]
    weight = tl.load(weight_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    bias = tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + rows * N + cols, (centred * rstd * weight + bias).to(out_ptr.dtype.element_ty), mask=mask)


def add_layer_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
    tile: Tile | None = None,
) -> torch.Tensor:
    """LayerNorm(x + residual) in one pass: two reads, one write per element."""
    n = x.shape[-1]
    rows, res = x.reshape(-1, n).contiguous(), residual.reshape(-1, n).contiguous()
    out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0]:
        block = triton.next_power_of_2(n)
        tile = tile or _norm_tile(rows.shape[0], block)
        _add_layer_norm_kernel[(triton.cdiv(rows.shape[0], tile.rows),)](
            rows, res, weight, bias, out, rows.shape[0], eps, N=n, BLOCK=block, ROWS=tile.rows,
            num_warps=tile.warps,
        )
    return out.view(x.shape)


@triton.jit
def _quantize_rows_kernel(x_ptr, out_ptr, scale_ptr, x_row_stride, fp8_max, N: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12) / fp8_max
    # IEEE division (Triton's `/` on float32 is the approximate one): the same e4m3 values as PyTorch's.
    quantized = tl.minimum(tl.maximum(tl.math.div_rn(x, scale), -fp8_max), fp8_max)
    tl.store(out_ptr + row * N + cols, quantized.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, scale)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """linear.quantize_rows in one pass: e4m3 rows of x [rows, k] and their float32 scales [rows, 1]."""
    from quiver.worker.engine.layers.linear import FP8_DTYPE, FP8_MAX

    rows = _row_major(x)
    n = rows.shape[-1]
    out = torch.empty(rows.shape, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((rows.shape[0], 1), dtype=torch.float32, device=x.device)
    if rows.shape[0]:
        block = triton.next_power_of_2(n)
        _quantize_rows_kernel[(rows.shape[0],)](
            rows, out, scale, rows.stride(0), FP8_MAX, N=n, BLOCK=block, num_warps=row_warps(block),
        )
    return out, scale
