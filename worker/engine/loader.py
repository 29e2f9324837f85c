"""Reading a Hugging Face checkpoint directory into one of the engine's model families.

Tensor names are reduced to the base model's own names: the `bert.`, `roberta.` and `model.` prefixes
that *ForSequenceClassification / *ForCausalLM checkpoints carry are dropped, and old BERT checkpoints'
LayerNorm `gamma`/`beta` become `weight`/`bias`. Only safetensors files are read (no pickle).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch
from safetensors import safe_open

from quiver.common.model_info import DECODER_TYPES, ENCODER_TYPES, KIND_RERANKER, ModelError, ModelInfo
from quiver.worker.engine.layers.fused import ElementwiseOps
from quiver.worker.engine.layers.linear import quantize_fields
from quiver.worker.engine.models.base import RaggedModel, Weights
from quiver.worker.engine.models.bert import BertEncoder
from quiver.worker.engine.models.qwen3 import Qwen3

log = logging.getLogger("quiver.engine")

BASE_PREFIXES = ("bert.", "roberta.", "xlm_roberta.", "model.")


def checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return [path / name for name in sorted(set(weight_map.values()))]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelError(f"{path} has no *.safetensors weights")
    return files


def canonical_name(name: str) -> str:
    for prefix in BASE_PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    if name.endswith("LayerNorm.gamma"):
        name = name[: -len("gamma")] + "weight"
    elif name.endswith("LayerNorm.beta"):
        name = name[: -len("beta")] + "bias"
    return name


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in checkpoint_files(path):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                tensors[canonical_name(name)] = handle.get_tensor(name)
    return tensors


def yes_no_token_ids(info: ModelInfo) -> tuple[int, int]:
    """Token ids of "yes" and "no" in the checkpoint's tokenizer.json (Qwen3-Reranker's answer tokens)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(info.tokenizer_path))
    ids = tokenizer.token_to_id("yes"), tokenizer.token_to_id("no")
    if ids[0] is None or ids[1] is None:
        raise ModelError(f"{info.tokenizer_path} has no single 'yes' / 'no' tokens for reranking")
    return ids[0], ids[1]


def build_model(
    info: ModelInfo, device: torch.device, dtype: torch.dtype, ops: ElementwiseOps, fp8_weights: bool = False
) -> RaggedModel:
    """The checkpoint's model in dtype; fp8_weights: its layers' dense-product weights in e4m3."""
    weights = Weights(read_tensors(info.path), device, dtype)
    model: BertEncoder | Qwen3
    if info.model_type in ENCODER_TYPES:
        model = BertEncoder(info, weights, ops)
    elif info.model_type in DECODER_TYPES:
        yes_no = yes_no_token_ids(info) if info.kind == KIND_RERANKER else None
        model = Qwen3(info, weights, ops, yes_no)
    else:
        raise ModelError(f"model_type {info.model_type!r} is not supported")
    if fp8_weights:
        quantize_to_fp8(model)
    unused = [n for n in weights.unused() if not n.endswith("position_ids")]
    if unused:
        shown = ", ".join(unused[:6]) + (", ..." if len(unused) > 6 else "")
        log.info("%d checkpoint tensors not used: %s", len(unused), shown)
    return model


def quantize_to_fp8(model: BertEncoder | Qwen3) -> None:
    """Store every transformer layer's dense-product weights in e4m3 (per-output-channel scales); the
    embeddings, norms and heads stay in the model's dtype."""
    for layer in model.layers:
        quantize_fields(layer, layer.LINEAR_WEIGHTS)
