"""The attention implementations the engine can choose from.

- PaddedSdpa: scatter the ragged rows into [S, H, L, D], mask padded keys, run SDPA, gather back. Works
  on every device and dtype and inside CUDA graphs; the CPU path and the float32 GPU path.
- TorchVarlen: torch.nn.attention.varlen.varlen_attn (FlashAttention-2 on ragged rows).
- AtenFlashVarlen: the same FlashAttention-2 kernel called as aten's op, which takes fewer key/value
  heads than query heads (GQA) where varlen_attn of some releases does not: repeating K and V for it
  cost Qwen3 5 of 37 ms at 32 x 512 tokens on an H200 (bench/RESULTS.md, 2026-12-03).
- FlashAttnVarlen: flash_attn.flash_attn_varlen_func, when the flash-attn package is installed.
- TritonVarlen: the hand-written Triton kernel of triton_attention.py on ragged rows; GQA native.
- DenseSdpa: SDPA on [S, H, L, D] views, for steps whose rows all have one length (one sequence, or
  equal lengths); pinned to one SDPA kernel, e.g. cuDNN.

plan_per_shape says whether a backend builds a plan for each shape at its first call there and keeps it per
thread (cuDNN's attention): 48-72 ms for XLM-R large at 33-35 rows of 532 tokens on an H100, against 0.3 ms
a call once built (bench/RESULTS.md, 2026-12-07, last). An eager step must not meet that on a request's path
(attention_select.py, dense_steps.py).
"""

from __future__ import annotations

import inspect
import threading
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from quiver.worker.engine.layers.attention import AttentionContext

_HALF_TYPES = (torch.float16, torch.bfloat16)
PADDING_LIMIT = 4  # padded attention on a GPU: at most this many padded slots per real token
# sdpa_kernel() pins SDPA's kernels through process-wide flags, so that a dense step's call on the dense-step
# thread (dense_steps.py) would change the kernels another thread's call may take ("No available kernel" for
# a float32 masked call, seen on an H100): every SDPA call here holds this lock.
_SDPA_FLAGS = threading.Lock()


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


class PaddedSdpa:
    """Rows padded to max_seqlen and masked: the CPU backend, and the GPU's fallback of last resort."""

    name = "padded_sdpa"
    plan_per_shape = False

    def supports(self, ctx: AttentionContext, dtype: torch.dtype) -> bool:
        # On a GPU, graph shapes carry empty rows and a generous max_seqlen (buckets.py); padding them
        # would cost memory and time quadratic in both, so offer it only where padding is a small part.
        return ctx.cu_seqlens.device.type != "cuda" or ctx.num_seqs * ctx.max_seqlen <= PADDING_LIMIT * ctx.num_tokens

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        rows, width = ctx.num_seqs, ctx.max_seqlen
        groups = q.shape[1] // k.shape[1]
        seq_ids, positions = ctx.seq_ids.long(), ctx.positions.long()

        def to_rows(x: torch.Tensor) -> torch.Tensor:
            out = x.new_zeros(rows, width, x.shape[1], x.shape[2])
            out[seq_ids, positions] = x
            return out.transpose(1, 2)

        lens = (ctx.cu_seqlens[1:] - ctx.cu_seqlens[:-1]).unsqueeze(1)
        key_index = torch.arange(width, device=q.device)
        mask = (key_index.unsqueeze(0) < lens)[:, None, None, :]
        if ctx.spec.causal:
            mask = mask & (key_index.unsqueeze(1) >= key_index.unsqueeze(0))
        with _SDPA_FLAGS:
            out = F.scaled_dot_product_attention(
                to_rows(q), to_rows(_repeat_kv(k, groups)), to_rows(_repeat_kv(v, groups)),
                attn_mask=mask, scale=ctx.spec.scale,
            )
        return out.transpose(1, 2)[seq_ids, positions]


class TorchVarlen:
    """PyTorch's varlen_attn; its keyword arguments changed between releases, so they are read off it."""

    plan_per_shape = False

    def __init__(self, expand_kv: bool = False) -> None:
        from torch.nn.attention.varlen import varlen_attn

        self._fn = varlen_attn
        self._params = set(inspect.signature(varlen_attn).parameters)
        self._expand_kv = expand_kv
        self.name = "torch_varlen_expand_kv" if expand_kv else "torch_varlen"

    def supports(self, ctx: AttentionContext, dtype: torch.dtype) -> bool:
        if dtype not in _HALF_TYPES or ctx.cu_seqlens.device.type != "cuda":
            return False
        if ctx.spec.causal and not ({"window_size", "is_causal"} & self._params):
            return False
        if "scale" not in self._params and abs(ctx.spec.scale - ctx.spec.head_dim**-0.5) > 1e-12:
            return False
        return ctx.spec.num_heads == ctx.spec.num_kv_heads or self._expand_kv or "enable_gqa" in self._params

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        kwargs: dict[str, Any] = {}
        if ctx.spec.causal:
            if "window_size" in self._params:
                kwargs["window_size"] = (-1, 0)
            else:
                kwargs["is_causal"] = True
        if "scale" in self._params:
            kwargs["scale"] = ctx.spec.scale
        groups = q.shape[1] // k.shape[1]
        if groups > 1:
            if self._expand_kv:
                k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
            else:
                kwargs["enable_gqa"] = True
        cu = ctx.cu_seqlens
        # A tuple comes back only with return_aux, which is never passed here.
        return cast(torch.Tensor, self._fn(q, k, v, cu, cu, ctx.max_seqlen, ctx.max_seqlen, **kwargs))


class AtenFlashVarlen:
    """FlashAttention-2 on ragged rows through torch.ops.aten._flash_attention_forward; GQA native."""

    name = "aten_flash_varlen"
    plan_per_shape = False

    def __init__(self) -> None:
        self._fn = torch.ops.aten._flash_attention_forward

    def supports(self, ctx: AttentionContext, dtype: torch.dtype) -> bool:
        return (dtype in _HALF_TYPES and ctx.cu_seqlens.device.type == "cuda"
                and ctx.spec.num_heads % ctx.spec.num_kv_heads == 0)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        cu = ctx.cu_seqlens
        out = self._fn(q, k, v, cu, cu, ctx.max_seqlen, ctx.max_seqlen, 0.0, ctx.spec.causal, False,
                       scale=ctx.spec.scale)
        return cast(torch.Tensor, out[0])


class FlashAttnVarlen:
    name = "flash_attn_varlen"
    plan_per_shape = False

    def __init__(self) -> None:
        from flash_attn import flash_attn_varlen_func

        self._fn = flash_attn_varlen_func

    def supports(self, ctx: AttentionContext, dtype: torch.dtype) -> bool:
        return dtype in _HALF_TYPES and ctx.cu_seqlens.device.type == "cuda"

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        cu = ctx.cu_seqlens
        return self._fn(
            q, k, v, cu, cu, ctx.max_seqlen, ctx.max_seqlen, softmax_scale=ctx.spec.scale, causal=ctx.spec.causal
        )


class TritonVarlen:
    name = "triton_varlen"
    plan_per_shape = False

    def __init__(self) -> None:
        from quiver.worker.engine.layers.triton_attention import varlen_attention

        self._fn = varlen_attention

    def supports(self, ctx: AttentionContext, dtype: torch.dtype) -> bool:
        width = ctx.spec.head_dim
        return (dtype in _HALF_TYPES and ctx.cu_seqlens.device.type == "cuda" and width >= 16
                and not width & (width - 1) and ctx.spec.num_heads % ctx.spec.num_kv_heads == 0)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        return self._fn(q, k, v, ctx.cu_seqlens, ctx.max_seqlen, ctx.spec.scale, ctx.spec.causal)


class DenseSdpa:
    """SDPA on equal-length rows, pinned to one kernel (cuDNN, flash, ...)."""

    def __init__(self, kernel: SDPBackend, label: str, expand_kv: bool) -> None:
        self._kernel = kernel
        self._expand_kv = expand_kv
        self.plan_per_shape = kernel == SDPBackend.CUDNN_ATTENTION
        self.name = f"dense_{label}" + ("_expand_kv" if expand_kv else "")

    def supports(self, ctx: AttentionContext, dtype: torch.dtype) -> bool:
        return ctx.dense_len > 0 and dtype in _HALF_TYPES and ctx.cu_seqlens.device.type == "cuda"

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
        rows, length = ctx.num_seqs, ctx.dense_len
        groups = q.shape[1] // k.shape[1]
        if self._expand_kv:
            k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)

        def to_rows(x: torch.Tensor) -> torch.Tensor:
            return x.view(rows, length, x.shape[1], x.shape[2]).transpose(1, 2)

        with _SDPA_FLAGS, sdpa_kernel([self._kernel]):
            out = F.scaled_dot_product_attention(
                to_rows(q), to_rows(k), to_rows(v), is_causal=ctx.spec.causal, scale=ctx.spec.scale,
                enable_gqa=groups > 1 and not self._expand_kv,
            )
        return out.transpose(1, 2).reshape(q.shape)


def available_backends(device: torch.device) -> list[Any]:
    """Every backend that imports on this device; the selector verifies and times them."""
    if device.type != "cuda":
        return [PaddedSdpa()]
    backends: list[Any] = []
    try:
        backends.append(FlashAttnVarlen())
    except ImportError:
        pass
    try:
        backends += [TorchVarlen(), TorchVarlen(expand_kv=True)]
    except ImportError:
        pass
    backends.append(AtenFlashVarlen())
    try:
        backends.append(TritonVarlen())
    except ImportError:
        pass
    for kernel, label in ((SDPBackend.CUDNN_ATTENTION, "cudnn"), (SDPBackend.FLASH_ATTENTION, "flash")):
        backends += [DenseSdpa(kernel, label, expand_kv=False), DenseSdpa(kernel, label, expand_kv=True)]
    backends.append(PaddedSdpa())
    return backends
