"""Qwen3 on ragged batches: as an embedder (causal + last token, or bidirectional + mean) or a reranker.

Pre-norm decoder: RMSNorm, q/k RMSNorm per head, rotary embedding, grouped-query attention, SwiGLU.
q/k/v and gate/up projections are fused into one matrix product each. The reranker (a Qwen3ForCausalLM
checkpoint) scores logit("yes") - logit("no") at each sequence's last token, from two lm_head rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from quiver.common.model_info import KIND_RERANKER, ModelInfo
from quiver.worker.engine.inputs import StepTensors
from quiver.worker.engine.layers.attention import AttentionContext, AttentionSpec, attention
from quiver.worker.engine.layers.fused import ElementwiseOps
from quiver.worker.engine.layers.linear import LinearWeight, weight_tensors
from quiver.worker.engine.layers.rotary import rope_theta, rotary_tables
from quiver.worker.engine.models.base import Weights, tensors_bytes
from quiver.worker.engine.pooling import gather_rows, mean_rows


@dataclass
class DecoderLayer:
    input_norm: torch.Tensor
    qkv_weight: LinearWeight
    qkv_bias: torch.Tensor | None
    qk_norm: torch.Tensor  # [H + Hkv, D]: q_norm's weight for each q head, then k_norm's for each kv head
    o_weight: LinearWeight
    o_bias: torch.Tensor | None
    post_attention_norm: torch.Tensor
    gate_up_weight: LinearWeight
    down_weight: LinearWeight

    # The dense products' weights: what `--dtype fp8` stores in e4m3.
    LINEAR_WEIGHTS = ("qkv_weight", "o_weight", "gate_up_weight", "down_weight")

    @classmethod
    def load(cls, weights: Weights, prefix: str, spec: AttentionSpec) -> DecoderLayer:
        attn = f"{prefix}.self_attn"
        q_norm, k_norm = weights.take(f"{attn}.q_norm.weight"), weights.take(f"{attn}.k_norm.weight")
        qk_norm = torch.cat([q_norm.expand(spec.num_heads, -1), k_norm.expand(spec.num_kv_heads, -1)])
        qkv = [f"{attn}.{name}_proj" for name in "qkv"]
        has_bias = f"{qkv[0]}.bias" in weights
        return cls(
            input_norm=weights.take(f"{prefix}.input_layernorm.weight"),
            qkv_weight=weights.take_cat([f"{n}.weight" for n in qkv]),
            qkv_bias=weights.take_cat([f"{n}.bias" for n in qkv]) if has_bias else None,
            qk_norm=qk_norm.contiguous(),
            o_weight=weights.take(f"{attn}.o_proj.weight"),
            o_bias=weights.take_optional(f"{attn}.o_proj.bias"),
            post_attention_norm=weights.take(f"{prefix}.post_attention_layernorm.weight"),
            gate_up_weight=weights.take_cat([f"{prefix}.mlp.gate_proj.weight", f"{prefix}.mlp.up_proj.weight"]),
            down_weight=weights.take(f"{prefix}.mlp.down_proj.weight"),
        )

    def tensors(self) -> list[torch.Tensor]:
        return [t for value in vars(self).values() for t in weight_tensors(value)]


class Qwen3:
    def __init__(self, info: ModelInfo, weights: Weights, ops: ElementwiseOps, yes_no_ids: tuple[int, int] | None) -> None:
        config = info.config
        self.info = info
        self.ops = ops
        self.eps = float(config.get("rms_norm_eps", 1e-6))
        heads = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or info.hidden_size // heads)
        kv_heads = int(config.get("num_key_value_heads") or heads)
        self.attention_spec = AttentionSpec(heads, kv_heads, head_dim, causal=info.causal)
        self.uses_token_types = False

        self.embed_table = weights.take("embed_tokens.weight")
        self.layers = [
            DecoderLayer.load(weights, f"layers.{i}", self.attention_spec) for i in range(int(config["num_hidden_layers"]))
        ]
        self.final_norm = weights.take("norm.weight")
        max_positions = int(config.get("max_position_embeddings", 32768))
        self.cos_table, self.sin_table = rotary_tables(head_dim, max_positions, rope_theta(config), weights.device)

        self.score_direction: torch.Tensor | None = None
        if info.kind == KIND_RERANKER:
            if yes_no_ids is None:
                raise ValueError("a reranker needs the token ids of 'yes' and 'no'")
            head_name = "lm_head.weight" if "lm_head.weight" in weights else "embed_tokens.weight"
            yes, no = weights.take_rows(head_name, list(yes_no_ids), dtype=torch.float32)
            self.score_direction = (yes - no).contiguous()
            self.output_dim = 1
        else:
            self.output_dim = info.hidden_size

    def parameters_bytes(self) -> int:
        held = [self.embed_table, self.final_norm, self.cos_table, self.sin_table]
        held += [self.score_direction] if self.score_direction is not None else []
        for layer in self.layers:
            held += layer.tensors()
        return tensors_bytes(held)

    def forward(self, step: StepTensors, attn: AttentionContext) -> torch.Tensor:
        return self._head(self._encode(step, attn), step)

    def forward_tokens(self, step: StepTensors, attn: AttentionContext) -> torch.Tensor:
        """One float32 row per token: its final (normed) hidden state."""
        return self.ops.rms_norm(self._encode(step, attn), self.final_norm, self.eps).float()

    def _encode(self, step: StepTensors, attn: AttentionContext) -> torch.Tensor:
        ops, spec = self.ops, self.attention_spec
        tokens = step.input_ids.shape[0]
        residual = F.embedding(step.input_ids, self.embed_table)
        hidden = ops.rms_norm(residual, self.layers[0].input_norm, self.eps)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            qkv = ops.linear(hidden, layer.qkv_weight, layer.qkv_bias)
            q, k, v = ops.qk_norm_rope(
                qkv, layer.qk_norm, self.cos_table, self.sin_table, step.positions,
                spec.num_heads, spec.num_kv_heads, self.eps,
            )
            context = attention(q, k, v, attn).reshape(tokens, spec.num_heads * spec.head_dim)
            projected = ops.linear(context, layer.o_weight, layer.o_bias)
            hidden, residual = ops.add_rms_norm(projected, residual, layer.post_attention_norm, self.eps)
            mlp_out = ops.linear(ops.linear_silu_mul(hidden, layer.gate_up_weight), layer.down_weight)
            if i < last:
                hidden, residual = ops.add_rms_norm(mlp_out, residual, self.layers[i + 1].input_norm, self.eps)
            else:
                residual = mlp_out + residual
        return residual

    def _head(self, final: torch.Tensor, step: StepTensors) -> torch.Tensor:
        pooling = "lasttoken" if self.score_direction is not None else self.info.pooling
        if pooling == "mean":
            return mean_rows(self.ops.rms_norm(final, self.final_norm, self.eps), step)
        index = step.first_index if pooling == "cls" else step.last_index
        pooled = self.ops.rms_norm(gather_rows(final, index), self.final_norm, self.eps).float()
        if self.score_direction is not None:
            return (pooled @ self.score_direction).unsqueeze(1)
        return pooled
