"""SPLADE's head on an encoder: the masked-LM logits of every token, log(1 + relu(.)), max over each sequence.

A *ForMaskedLM BERT checkpoint (naver/splade-v3's layout) keeps its MLM head under `cls.predictions`:
transform.dense → activation → transform.LayerNorm → decoder (tied to the word embeddings when the
checkpoint leaves it out) + bias. The result is one float32 row per sequence over the whole vocabulary,
mostly zeros; the worker ships only its non-zeros.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quiver.worker.engine.inputs import StepTensors
from quiver.worker.engine.layers.fused import ElementwiseOps
from quiver.worker.engine.models.base import Weights


class SpladeHead:
    def __init__(self, weights: Weights, word_table: torch.Tensor, hidden_act: str, eps: float) -> None:
        prefix = "cls.predictions"
        self.dense_weight = weights.take(f"{prefix}.transform.dense.weight")
        self.dense_bias = weights.take(f"{prefix}.transform.dense.bias")
        self.norm_weight = weights.take(f"{prefix}.transform.LayerNorm.weight")
        self.norm_bias = weights.take(f"{prefix}.transform.LayerNorm.bias")
        decoder = weights.take_optional(f"{prefix}.decoder.weight")
        self.decoder_weight = word_table if decoder is None else decoder
        bias = weights.take_optional(f"{prefix}.bias")
        self.decoder_bias = weights.take(f"{prefix}.decoder.bias") if bias is None else bias
        self.hidden_act = hidden_act
        self.eps = eps
        self.vocab_size = int(self.decoder_weight.shape[0])

    def tensors(self) -> list[torch.Tensor]:
        return [self.dense_weight, self.dense_bias, self.norm_weight, self.norm_bias, self.decoder_weight,
                self.decoder_bias]

    def __call__(self, hidden: torch.Tensor, step: StepTensors, ops: ElementwiseOps) -> torch.Tensor:
        """Final token states [T, H] → float32 [S, vocab]: per sequence, max over its tokens of log1p(relu(logits))."""
        x = ops.activation(F.linear(hidden, self.dense_weight, self.dense_bias), self.hidden_act)
        x = F.layer_norm(x, (x.shape[-1],), self.norm_weight, self.norm_bias, self.eps)
        weights = torch.log1p(torch.relu(F.linear(x, self.decoder_weight, self.decoder_bias).float()))
        rows = torch.zeros(step.seq_lens.shape[0], self.vocab_size, dtype=torch.float32, device=hidden.device)
        return rows.index_reduce_(0, step.seq_ids, weights, "amax", include_self=True)
