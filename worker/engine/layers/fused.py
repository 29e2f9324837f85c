"""Elementwise work between the matrix products, written once and optionally fused.

Each function is one fusion unit: on the GPU, torch.compile turns it into one or two Triton kernels
(residual add + norm, q/k norm + rotary, SwiGLU, GELU, embedding sum + LayerNorm, an FP8 product's
per-token activation quantisation), or triton_ops.py replaces it with a hand-written kernel; on the
CPU, or with fusion off, the same functions run as plain PyTorch. Matrix products stay outside:
ElementwiseOps.linear sends them to cuBLAS, or to torch._scaled_mm for FP8 weights (linear.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from quiver.worker.engine.layers.linear import Fp8Weight, LinearWeight, fp8_linear, quantize_rows

log = logging.getLogger("quiver.engine")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual): the pre-norm transformer's residual step."""
    summed = x + residual
    return rms_norm(summed, weight, eps), summed


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def qk_norm_rope(
    qkv: torch.Tensor,
    qk_weight: torch.Tensor,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    positions: torch.Tensor,
    num_heads: int,
    num_kv_heads: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split Qwen3's fused qkv [T, (H + 2 Hkv) D], RMS-normalise q and k per head, rotate them.

    q and k heads are normalised and rotated together as one [T, H + Hkv, D] block (qk_weight holds the
    q-norm weight for the first H heads and the k-norm weight for the rest), so that this is one kernel.
    q and k come back as views of that block, v as a view of qkv.
    """
    tokens = qkv.shape[0]
    head_dim = qk_weight.shape[1]
    qk_width = (num_heads + num_kv_heads) * head_dim
    qk = qkv[:, :qk_width].view(tokens, num_heads + num_kv_heads, head_dim)
    cos = cos_table[positions].unsqueeze(1)
    sin = sin_table[positions].unsqueeze(1)
    qk = _rotate(rms_norm(qk, qk_weight, eps), cos, sin)
    v = qkv[:, qk_width:].view(tokens, num_kv_heads, head_dim)
    return qk[:, :num_heads], qk[:, num_heads:], v


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


TANH_GELU_KINDS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
GELU_KINDS = ("gelu", *TANH_GELU_KINDS)
# Below it the one-kernel SwiGLU product is no faster than the separate units, a short product's time being
# mostly fixed cost: on an H100, 14.4 against 14.0 µs at 512 tokens, 24.3 against 24.0 at 1,024, 45.9 against
# 50.3 at 2,048 (bench/RESULTS.md, 2026-12-07, last sitting).
SWIGLU_PRODUCT_MIN_TOKENS = 2048


def activation(x: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "gelu":
        return F.gelu(x)
    if kind in TANH_GELU_KINDS:
        return F.gelu(x, approximate="tanh")
    if kind == "relu":
        return F.relu(x)
    if kind in ("silu", "swish"):
        return F.silu(x)
    raise NotImplementedError(f"activation {kind!r} is not supported")


def add_layer_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float
) -> torch.Tensor:
    """LayerNorm(x + residual): the post-norm encoder's residual step."""
    return F.layer_norm(x + residual, (x.shape[-1],), weight, bias, eps)


def embed_layer_norm(
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    token_type_ids: torch.Tensor,
    word_table: torch.Tensor,
    position_table: torch.Tensor,
    type_table: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    summed = word_table[input_ids] + type_table[token_type_ids] + position_table[positions]
    return F.layer_norm(summed, (summed.shape[-1],), weight, bias, eps)


@dataclass(frozen=True)
class ElementwiseOps:
    """The fusion units a model calls: plain functions, their compiled versions, or Triton kernels."""

    mode: str
    rms_norm: Callable[..., torch.Tensor]
    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    qk_norm_rope: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    silu_mul: Callable[..., torch.Tensor]
    activation: Callable[..., torch.Tensor]
    add_layer_norm: Callable[..., torch.Tensor]
    embed_layer_norm: Callable[..., torch.Tensor]
    quantize_rows: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    gelu_epilogue: bool = False  # a GELU layer's product, bias and GELU in one cuBLASLt call (start-up chooses)
    # A SwiGLU layer's gate/up product and SwiGLU in one Triton kernel (swiglu_product.py; start-up chooses).
    swiglu_product: Callable[..., torch.Tensor] | None = None

    def linear(self, x: torch.Tensor, weight: LinearWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
        """A dense layer's product: cuBLAS for a plain weight, torch._scaled_mm for an FP8 one (its
        activations quantised per token by this set's quantize_rows)."""
        if isinstance(weight, Fp8Weight):
            return fp8_linear(x, weight, bias, self.quantize_rows)
        return F.linear(x, weight, bias)

    def linear_activation(self, x: torch.Tensor, weight: LinearWeight, bias: torch.Tensor | None,
                          kind: str) -> torch.Tensor:
        """activation(linear(x)). With gelu_epilogue, a bf16 GELU layer runs as one torch._addmm_activation:
        on CUDA, cuBLASLt's GELU_BIAS epilogue, which applies GELU's tanh form while it writes the product,
        so the product's output is not read back by a separate kernel."""
        if self.gelu_epilogue and kind in GELU_KINDS and bias is not None and not isinstance(weight, Fp8Weight):
            return torch._addmm_activation(bias, x, weight.t(), use_gelu=True)
        return self.activation(self.linear(x, weight, bias), kind)

    def linear_silu_mul(self, x: torch.Tensor, gate_up_weight: LinearWeight) -> torch.Tensor:
        """silu_mul(linear(x, gate_up_weight)): with swiglu_product, a step of SWIGLU_PRODUCT_MIN_TOKENS or
        more with a plain weight runs it as one kernel, which never writes the [T, 2 I] product."""
        if (self.swiglu_product is not None and x.shape[0] >= SWIGLU_PRODUCT_MIN_TOKENS
                and not isinstance(gate_up_weight, Fp8Weight)):
            return self.swiglu_product(x, gate_up_weight)
        return self.silu_mul(self.linear(x, gate_up_weight))


_UNITS: dict[str, Any] = {
    "rms_norm": rms_norm,
    "add_rms_norm": add_rms_norm,
    "qk_norm_rope": qk_norm_rope,
    "silu_mul": silu_mul,
    "activation": activation,
    "add_layer_norm": add_layer_norm,
    "embed_layer_norm": embed_layer_norm,
    "quantize_rows": quantize_rows,
}

# Arguments whose first dimension is the step's token (or row) count: the only dynamic dimension.
_TOKEN_ARGS = {
    "rms_norm": (0,),
    "add_rms_norm": (0, 1),
    "qk_norm_rope": (0, 4),
    "silu_mul": (0,),
    "activation": (0,),
    "add_layer_norm": (0, 1),
    "embed_layer_norm": (0, 1, 2),
    "quantize_rows": (0,),
}


class _TokenDynamic:
    """A compiled unit whose token dimension is dynamic and every other size (weights, heads) static.

    Marking the token dimension before each (eager) call gives one kernel for all token counts, while
    weights and head counts stay compile-time constants; two models in one process get separate
    specialisations instead of one kernel made dynamic in everything.
    """

    def __init__(self, fn: Callable[..., object], token_args: tuple[int, ...]) -> None:
        self._compiled = torch.compile(fn, fullgraph=True)
        self._token_args = token_args

    def __call__(self, *args: object) -> Any:
        for index in self._token_args:
            torch._dynamo.maybe_mark_dynamic(args[index], 0)
        return self._compiled(*args)


def plain_ops() -> ElementwiseOps:
    return ElementwiseOps(mode="none", **_UNITS)


def compiled_ops() -> ElementwiseOps:
    """torch.compile each unit with a dynamic token dimension (see _TokenDynamic)."""
    import torch._dynamo

    config = torch._dynamo.config
    # Sizes not marked dynamic stay static: no "automatic dynamic" recompiles that would make weight
    # shapes symbolic when a second model (tests, benchmarks) calls the same unit. Process-wide.
    config.automatic_dynamic_shapes = False
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(getattr(config, name), 64))
    compiled: dict[str, Any] = {name: _TokenDynamic(fn, _TOKEN_ARGS[name]) for name, fn in _UNITS.items()}
    return ElementwiseOps(mode="compile", **compiled)


def triton_kernel_ops() -> ElementwiseOps:
    """The hand-written Triton kernels of triton_ops.py; the embedding sum (once a step) stays plain.

    Imported here, not at module load, so that the CPU path never needs Triton installed.
    """
    from quiver.worker.engine.layers import triton_ops as kernels

    return ElementwiseOps(
        mode="triton",
        rms_norm=kernels.rms_norm,
        add_rms_norm=kernels.add_rms_norm,
        qk_norm_rope=kernels.qk_norm_rope,
        silu_mul=kernels.silu_mul,
        activation=kernels.activation,
        add_layer_norm=kernels.add_layer_norm,
        embed_layer_norm=embed_layer_norm,
        quantize_rows=kernels.quantize_rows,
    )
