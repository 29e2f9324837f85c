"""A SwiGLU layer's gate/up product and silu(gate) * up in one Triton kernel, its tiles loaded by TMA (Hopper).

The separate units write the [T, 2 I] product and read it back for SwiGLU: at 4,096 tokens of Qwen3-0.6B's
shape the pair took 104.7 µs on an H100 and this kernel 96.1 (bench/RESULTS.md, 2026-12-07, last sitting).
Each program keeps two float32 accumulators, one for a block of the gate half's columns and
one for the same columns of the up half, and writes only silu(gate) * up, rounded as the separate units round
(the product to the activation dtype, then silu, then the multiply): on the GPU tests' shapes its rows
equal theirs bit for bit. Up to 1,024 tokens it is no faster, a short product's time being mostly fixed
cost, so the op set calls it only from fused.SWIGLU_PRODUCT_MIN_TOKENS; start-up keeps it only where it
agrees and replays faster (choices.choose_swiglu_product). Imported only on a GPU: the CPU path never needs
Triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

# One plan, the fastest or within 4 % of it at 2,048-16,384 tokens among 12 timed on an H100 (2026-12-07).
BLOCK_M, BLOCK_N, BLOCK_K, STAGES, WARPS, GROUP_M = 128, 64, 64, 3, 8, 8
# TMA's requirements: Hopper or newer, and every row of a tensor starting on a 16-byte boundary.
MIN_CAPABILITY = (9, 0)
TMA_ALIGNMENT_BYTES = 16
DTYPES = (torch.bfloat16, torch.float16)


@triton.jit
def _gate_up_silu_kernel(x_desc, w_desc, out_desc, M, N, K, GROUP_M: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # Programs go down GROUP_M row blocks before the next column block, so the rows they share stay in L2.
    pid = tl.program_id(0)
    per_group = GROUP_M * (N // BLOCK_N)
    first_m = (pid // per_group) * GROUP_M
    group_rows = min(tl.cdiv(M, BLOCK_M) - first_m, GROUP_M)
    off_m = (first_m + (pid % per_group) % group_rows) * BLOCK_M
    off_n = ((pid % per_group) // group_rows) * BLOCK_N
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K):
        x = x_desc.load([off_m, k])
        gate = tl.dot(x, w_desc.load([off_n, k]).T, gate)
        up = tl.dot(x, w_desc.load([off_n + N, k]).T, up)
    dtype = out_desc.dtype
    rounded_gate = gate.to(dtype).to(tl.float32)
    silu = (rounded_gate * tl.sigmoid(rounded_gate)).to(dtype).to(tl.float32)
    out_desc.store([off_m, off_n], (silu * up.to(dtype).to(tl.float32)).to(dtype))


def unsupported_reason(gate_up_weight: torch.Tensor) -> str:
    """Why this kernel cannot run products on this fused [2 I, K] weight ("" when it can)."""
    device = gate_up_weight.device
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < MIN_CAPABILITY:
        return "TMA needs a GPU of compute capability 9.0 or newer"
    if gate_up_weight.dtype not in DTYPES or gate_up_weight.dim() != 2:
        return f"a {gate_up_weight.dtype} weight of {gate_up_weight.dim()} dimensions"
    width, k = gate_up_weight.shape
    if width % (2 * BLOCK_N) or (k * gate_up_weight.element_size()) % TMA_ALIGNMENT_BYTES:
        return f"a [{width}, {k}] weight: each half's rows must be a multiple of {BLOCK_N}, its rows 16-byte aligned"
    return ""


def gate_up_silu(x: torch.Tensor, gate_up_weight: torch.Tensor) -> torch.Tensor:
    """silu(x @ gate.T) * (x @ up.T) for x [T, K] and the fused [2 I, K] gate/up weight: [T, I]."""
    tokens, k = x.shape
    width = gate_up_weight.shape[0]
    if (x.stride(1) != 1 or (x.stride(0) * x.element_size()) % TMA_ALIGNMENT_BYTES
            or x.data_ptr() % TMA_ALIGNMENT_BYTES or x.dtype != gate_up_weight.dtype
            or not gate_up_weight.is_contiguous() or gate_up_weight.shape[1] != k):
        raise ValueError(f"gate_up_silu cannot take a {tuple(x.shape)} {x.dtype} input with strides {x.stride()} "
                         f"on a {tuple(gate_up_weight.shape)} {gate_up_weight.dtype} weight")
    inter = width // 2
    out = torch.empty((tokens, inter), dtype=x.dtype, device=x.device)
    if tokens:
        grid = (triton.cdiv(tokens, BLOCK_M) * (inter // BLOCK_N),)
        _gate_up_silu_kernel[grid](
            TensorDescriptor.from_tensor(x, [BLOCK_M, BLOCK_K]),
            TensorDescriptor.from_tensor(gate_up_weight, [BLOCK_N, BLOCK_K]),
            TensorDescriptor.from_tensor(out, [BLOCK_M, BLOCK_N]),
            tokens, inter, k, GROUP_M=GROUP_M, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
            num_stages=STAGES, num_warps=WARPS,
        )
    return out
