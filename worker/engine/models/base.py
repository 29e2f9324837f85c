"""What every model family provides to the engine, and the weight store they are built from."""

from __future__ import annotations

from typing import Protocol

import torch

from quiver.worker.engine.inputs import StepTensors
from quiver.worker.engine.layers.attention import AttentionContext, AttentionSpec
from quiver.worker.engine.layers.fused import ElementwiseOps


class RaggedModel(Protocol):
    """A network on one padded ragged step: returns float32 [num_seqs, output_dim], one row per sequence."""

    output_dim: int
    attention_spec: AttentionSpec
    uses_token_types: bool
    ops: ElementwiseOps

    def forward(self, step: StepTensors, attn: AttentionContext) -> torch.Tensor: ...

    def forward_tokens(self, step: StepTensors, attn: AttentionContext) -> torch.Tensor:
        """Float32 [num_tokens, token_dim]: one row per token (embedders only)."""
        ...

    def parameters_bytes(self) -> int: ...


class Weights:
    """Checkpoint tensors by canonical name, moved to the device and dtype as the model takes them."""

    def __init__(self, tensors: dict[str, torch.Tensor], device: torch.device, dtype: torch.dtype) -> None:
        self._tensors = tensors
        self._taken: set[str] = set()
        self.device = device
        self.dtype = dtype

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def take(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
        if name not in self._tensors:
            raise KeyError(f"the checkpoint has no tensor {name!r}")
        self._taken.add(name)
        return self._tensors[name].to(device=self.device, dtype=dtype or self.dtype).contiguous()

    def take_rows(self, name: str, rows: list[int], dtype: torch.dtype | None = None) -> torch.Tensor:
        """Selected rows of a tensor, picked before the move (e.g. two rows of a large lm_head)."""
        if name not in self._tensors:
            raise KeyError(f"the checkpoint has no tensor {name!r}")
        self._taken.add(name)
        return self._tensors[name][rows].to(device=self.device, dtype=dtype or self.dtype).contiguous()

    def take_optional(self, name: str, dtype: torch.dtype | None = None) -> torch.Tensor | None:
        return self.take(name, dtype) if name in self._tensors else None

    def take_cat(self, names: list[str]) -> torch.Tensor:
        """Concatenate tensors along dim 0 (fused q/k/v or gate/up projections)."""
        return torch.cat([self.take(n) for n in names], dim=0).contiguous()

    def unused(self) -> list[str]:
        return sorted(set(self._tensors) - self._taken)


def tensors_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes held by distinct tensors (views of one storage counted once)."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())
