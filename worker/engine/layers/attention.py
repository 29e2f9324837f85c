"""Attention metadata of one step, passed explicitly to every attention call.

Ragged attention needs the row boundaries (cu_seqlens) and an upper bound on the row length; padded
fallbacks also need each token's row and position. The engine builds one AttentionContext per step and
chooses the backend for the step's shape before the model runs, so that a captured CUDA graph holds
only kernel launches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class AttentionSpec:
    """What a model's attention looks like; the same for every layer."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    causal: bool

    @property
    def scale(self) -> float:
        return self.head_dim**-0.5


@dataclass(frozen=True)
class AttentionContext:
    cu_seqlens: torch.Tensor  # int32 [S+1]
    seq_ids: torch.Tensor  # int32 [T]
    positions: torch.Tensor  # int32 [T]
    num_seqs: int
    num_tokens: int
    max_seqlen: int
    dense_len: int  # > 0: every row has exactly this length
    spec: AttentionSpec
    backend: AttentionBackend


class AttentionBackend(Protocol):
    """One attention implementation: q [T, H, D], k and v [T, Hkv, D] -> [T, H, D]."""

    name: str
    plan_per_shape: bool  # builds a plan at its first call at a shape, kept per thread (attention_backends.py)

    def supports(self, ctx: AttentionContext, dtype: torch.dtype) -> bool: ...

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext) -> torch.Tensor: ...


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext) -> torch.Tensor:
    """Run the step's chosen backend: q [T, H, D], k/v [T, Hkv, D] -> [T, H, D]."""
    return ctx.backend(q, k, v, ctx)
