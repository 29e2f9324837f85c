"""BGE-M3's two extra heads on its XLM-RoBERTa encoder, and the token rows they give.

The repository ships them beside model.safetensors as torch.save'd state dicts of nn.Linear
(FlagEmbedding's layout): sparse_linear.pt (hidden → 1) and colbert_linear.pt (hidden → hidden). They
are read with torch.load(weights_only=True), which unpickles tensors and containers only.

One forward pass gives every output as one float32 row per token, [T, hidden + 1]:
- columns [0, hidden): the ColBERT vector colbert_linear(h), L2-normalised; in a sequence's first
  (CLS) row instead the dense vector, h normalised (BGE-M3's dense output is its CLS state);
- column hidden: the token's lexical weight relu(sparse_linear(h)).
The frontend turns them into the three outputs: the first row of each sequence (dense), the other rows
(ColBERT, CLS excluded as FlagEmbedding excludes it) and the max weight per token id (sparse).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from quiver.common.model_info import M3_HEAD_FILES, ModelError
from quiver.worker.engine.inputs import StepTensors


def _linear_state(path: Path, in_features: int, out_features: int) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # any unreadable file is a model error, with its reason
        raise ModelError(f"cannot read {path}: {exc}") from exc
    if not isinstance(state, dict) or set(state) != {"weight", "bias"}:
        raise ModelError(f"{path} is not an nn.Linear state dict (weight, bias)")
    weight, bias = state["weight"], state["bias"]
    if tuple(weight.shape) != (out_features, in_features) or tuple(bias.shape) != (out_features,):
        raise ModelError(f"{path} holds a Linear {tuple(weight.shape)}; ({out_features}, {in_features}) is due")
    return weight, bias


class M3Heads:
    def __init__(self, path: Path, hidden_size: int, device: torch.device, dtype: torch.dtype) -> None:
        sparse_file, colbert_file = (path / name for name in M3_HEAD_FILES)
        self.sparse_weight, self.sparse_bias = (
            t.to(device=device, dtype=dtype).contiguous() for t in _linear_state(sparse_file, hidden_size, 1))
        self.colbert_weight, self.colbert_bias = (
            t.to(device=device, dtype=dtype).contiguous() for t in _linear_state(colbert_file, hidden_size, hidden_size))

    def tensors(self) -> list[torch.Tensor]:
        return [self.sparse_weight, self.sparse_bias, self.colbert_weight, self.colbert_bias]

    def token_rows(self, hidden: torch.Tensor, step: StepTensors) -> torch.Tensor:
        """Final token states [T, H] → float32 [T, H + 1] as the module docstring lays out."""
        colbert = F.normalize(F.linear(hidden, self.colbert_weight, self.colbert_bias).float(), dim=-1)
        # A row's first token is the one at position 0 (padding tokens too, whose rows are dropped). Not
        # first_index: a graph's empty rows point it at the step's last token, which may be a real one.
        first = (step.positions == 0).unsqueeze(1)
        vectors = torch.where(first, F.normalize(hidden.float(), dim=-1), colbert)
        weights = torch.relu(F.linear(hidden, self.sparse_weight, self.sparse_bias).float())
        return torch.cat([vectors, weights], dim=1)
