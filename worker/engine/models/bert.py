"""BERT, RoBERTa and XLM-RoBERTa encoders on ragged batches, with their pooling and classifier heads.

Post-norm transformer: learned absolute positions (RoBERTa's start at pad_token_id + 1), token types,
LayerNorm, GELU. Embedders pool (cls / mean / lasttoken); *ForSequenceClassification checkpoints return
the raw logits of their head: BERT's pooler + classifier, or RoBERTa's classifier.dense + out_proj;
*ForMaskedLM checkpoints are SPLADE models and return their vocabulary-wide sparse rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from quiver.common.model_info import KIND_CLASSIFIER, KIND_SPARSE, ModelInfo
from quiver.worker.engine.inputs import StepTensors
from quiver.worker.engine.layers.attention import AttentionContext, AttentionSpec, attention
from quiver.worker.engine.layers.fused import ElementwiseOps
from quiver.worker.engine.layers.linear import LinearWeight, weight_tensors
from quiver.worker.engine.models.base import Weights, tensors_bytes
from quiver.worker.engine.models.m3 import M3Heads
from quiver.worker.engine.models.sparse import SpladeHead
from quiver.worker.engine.pooling import pool

ROBERTA_FAMILY = ("roberta", "xlm-roberta")


@dataclass
class EncoderLayer:
    qkv_weight: LinearWeight
    qkv_bias: torch.Tensor
    out_weight: LinearWeight
    out_bias: torch.Tensor
    attn_norm_weight: torch.Tensor
    attn_norm_bias: torch.Tensor
    up_weight: LinearWeight
    up_bias: torch.Tensor
    down_weight: LinearWeight
    down_bias: torch.Tensor
    mlp_norm_weight: torch.Tensor
    mlp_norm_bias: torch.Tensor

    # The dense products' weights: what `--dtype fp8` stores in e4m3.
    LINEAR_WEIGHTS = ("qkv_weight", "out_weight", "up_weight", "down_weight")

    @classmethod
    def load(cls, weights: Weights, prefix: str) -> EncoderLayer:
        attn = f"{prefix}.attention"
        qkv = [f"{attn}.self.{name}" for name in ("query", "key", "value")]
        return cls(
            qkv_weight=weights.take_cat([f"{n}.weight" for n in qkv]),
            qkv_bias=weights.take_cat([f"{n}.bias" for n in qkv]),
            out_weight=weights.take(f"{attn}.output.dense.weight"),
            out_bias=weights.take(f"{attn}.output.dense.bias"),
            attn_norm_weight=weights.take(f"{attn}.output.LayerNorm.weight"),
            attn_norm_bias=weights.take(f"{attn}.output.LayerNorm.bias"),
            up_weight=weights.take(f"{prefix}.intermediate.dense.weight"),
            up_bias=weights.take(f"{prefix}.intermediate.dense.bias"),
            down_weight=weights.take(f"{prefix}.output.dense.weight"),
            down_bias=weights.take(f"{prefix}.output.dense.bias"),
            mlp_norm_weight=weights.take(f"{prefix}.output.LayerNorm.weight"),
            mlp_norm_bias=weights.take(f"{prefix}.output.LayerNorm.bias"),
        )

    def tensors(self) -> list[torch.Tensor]:
        return [t for value in vars(self).values() for t in weight_tensors(value)]


class BertEncoder:
    def __init__(self, info: ModelInfo, weights: Weights, ops: ElementwiseOps) -> None:
        config = info.config
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise NotImplementedError(f"position_embedding_type {config['position_embedding_type']!r}")
        self.info = info
        self.ops = ops
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.hidden_act = str(config.get("hidden_act", "gelu"))
        heads = int(config["num_attention_heads"])
        self.attention_spec = AttentionSpec(heads, heads, info.hidden_size // heads, causal=False)
        self.uses_token_types = info.model_type not in ROBERTA_FAMILY

        position_offset = int(config.get("pad_token_id", 1)) + 1 if info.model_type in ROBERTA_FAMILY else 0
        self.word_table = weights.take("embeddings.word_embeddings.weight")
        self.position_table = weights.take("embeddings.position_embeddings.weight")[position_offset:]
        self.type_table = weights.take("embeddings.token_type_embeddings.weight")
        self.embed_norm_weight = weights.take("embeddings.LayerNorm.weight")
        self.embed_norm_bias = weights.take("embeddings.LayerNorm.bias")
        self.layers = [
            EncoderLayer.load(weights, f"encoder.layer.{i}") for i in range(int(config["num_hidden_layers"]))
        ]

        self.head: list[torch.Tensor] = []
        self.splade: SpladeHead | None = None
        if info.kind == KIND_SPARSE:
            self.splade = SpladeHead(weights, self.word_table, self.hidden_act, self.eps)
            self.output_dim = self.splade.vocab_size
        elif info.kind == KIND_CLASSIFIER:
            if "classifier.out_proj.weight" in weights:
                names = ["classifier.dense.weight", "classifier.dense.bias", "classifier.out_proj.weight"]
                names.append("classifier.out_proj.bias")
            else:
                names = ["pooler.dense.weight", "pooler.dense.bias", "classifier.weight", "classifier.bias"]
            self.head = [weights.take(n) for n in names]
            self.output_dim = int(self.head[2].shape[0])
        else:
            self.output_dim = info.hidden_size
        self.m3 = M3Heads(info.path, info.hidden_size, weights.device, weights.dtype) if info.m3_heads else None

    def parameters_bytes(self) -> int:
        held = [self.word_table, self.position_table, self.type_table, self.embed_norm_weight]
        held += [self.embed_norm_bias, *self.head, *(self.splade.tensors() if self.splade else [])]
        held += self.m3.tensors() if self.m3 else []
        for layer in self.layers:
            held += layer.tensors()
        return tensors_bytes(held)

    def forward(self, step: StepTensors, attn: AttentionContext) -> torch.Tensor:
        x = self._encode(step, attn)
        if self.splade is not None:
            return self.splade(x, step, self.ops)
        if self.head:
            dense_weight, dense_bias, out_weight, out_bias = self.head
            first = x.index_select(0, step.first_index)
            return F.linear(torch.tanh(F.linear(first, dense_weight, dense_bias)), out_weight, out_bias).float()
        return pool(x, step, self.info.pooling)

    def forward_tokens(self, step: StepTensors, attn: AttentionContext) -> torch.Tensor:
        """One float32 row per token: the final hidden state, or BGE-M3's rows (models/m3.py)."""
        x = self._encode(step, attn)
        return self.m3.token_rows(x, step) if self.m3 is not None else x.float()

    def _encode(self, step: StepTensors, attn: AttentionContext) -> torch.Tensor:
        ops, spec = self.ops, self.attention_spec
        tokens = step.input_ids.shape[0]
        width = spec.num_heads * spec.head_dim
        x = ops.embed_layer_norm(
            step.input_ids, step.positions, step.token_type_ids,
            self.word_table, self.position_table, self.type_table,
            self.embed_norm_weight, self.embed_norm_bias, self.eps,
        )
        for layer in self.layers:
            qkv = ops.linear(x, layer.qkv_weight, layer.qkv_bias)
            q, k, v = (part.view(tokens, spec.num_heads, spec.head_dim) for part in qkv.split(width, dim=-1))
            context = attention(q, k, v, attn).reshape(tokens, width)
            projected = ops.linear(context, layer.out_weight, layer.out_bias)
            x = ops.add_layer_norm(projected, x, layer.attn_norm_weight, layer.attn_norm_bias, self.eps)
            up = ops.linear_activation(x, layer.up_weight, layer.up_bias, self.hidden_act)
            down = ops.linear(up, layer.down_weight, layer.down_bias)
            x = ops.add_layer_norm(down, x, layer.mlp_norm_weight, layer.mlp_norm_bias, self.eps)
        return x
