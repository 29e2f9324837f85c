"""Tiny random checkpoints of every family the engine serves, and transformers' reference outputs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from quiver.bench.engine.checkpoints import NO_ID, YES_ID, make_bidirectional, save_checkpoint

VOCAB = 96
MAX_POSITIONS = 128


@dataclass(frozen=True)
class Family:
    name: str
    build: Callable[[], Any]  # a transformers model in eval mode
    pooling: str | None = None  # sentence-transformers pooling; None for scorers
    uses_token_types: bool = False


def _bert_config(**extra: Any) -> Any:
    from transformers import BertConfig

    return BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=MAX_POSITIONS, type_vocab_size=2, **extra,
    )


def _roberta_config(cls_name: str, **extra: Any) -> Any:
    import transformers

    return getattr(transformers, cls_name)(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=MAX_POSITIONS + 2, pad_token_id=1, type_vocab_size=1, **extra,
    )


def _qwen3_config(max_positions: int = MAX_POSITIONS, **extra: Any) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=max_positions, rope_theta=10000.0,
        rms_norm_eps=1e-6, **extra,
    )


def spread_weights(model: Any, seed: int = 0) -> Any:
    """Random weights wide enough that different inputs give clearly different outputs."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.2)
            elif "norm" in name.lower():
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.1)
    return model.eval()


def _make(cls_name: str, config: Any, **kwargs: Any) -> Any:
    import transformers

    torch.manual_seed(0)
    return spread_weights(getattr(transformers, cls_name)(config, **kwargs))


FAMILIES = [
    Family("bert_cls", lambda: _make("BertModel", _bert_config(), add_pooling_layer=False), "cls", True),
    Family("bert_mean", lambda: _make("BertModel", _bert_config(hidden_act="gelu_new")), "mean", True),
    Family("roberta_mean", lambda: _make("RobertaModel", _roberta_config("RobertaConfig")), "mean"),
    Family("xlmr_cls", lambda: _make("XLMRobertaModel", _roberta_config("XLMRobertaConfig")), "cls"),
    Family("bert_classifier", lambda: _make("BertForSequenceClassification", _bert_config(num_labels=3)), None, True),
    Family(
        "roberta_classifier",
        lambda: _make("RobertaForSequenceClassification", _roberta_config("RobertaConfig", num_labels=2)),
    ),
    Family(
        "xlmr_classifier",
        lambda: _make("XLMRobertaForSequenceClassification", _roberta_config("XLMRobertaConfig", num_labels=1)),
    ),
    Family("qwen3_causal_last", lambda: _make("Qwen3Model", _qwen3_config()), "lasttoken"),
    Family("qwen3_bidirectional_mean", lambda: make_bidirectional(_make("Qwen3Model", _qwen3_config())), "mean"),
    Family("qwen3_reranker", lambda: _make("Qwen3ForCausalLM", _qwen3_config(tie_word_embeddings=True))),
]

# Rows longer than the smallest length class (512) need a model that takes them: rotary positions only.
LONG_QWEN3 = Family(
    "qwen3_long_mean", lambda: make_bidirectional(_make("Qwen3Model", _qwen3_config(max_positions=4096))), "mean"
)


def write_family(family: Family, root: Path) -> tuple[Path, Any]:
    model = family.build()
    path = save_checkpoint(model, root / family.name, pooling=family.pooling, normalize=False)
    return path, model


def reference_rows(
    family: Family, model: Any, sequences: list[np.ndarray], types: list[np.ndarray], normalize: list[bool]
) -> np.ndarray:
    """transformers' output for each sequence alone (no padding), pooled as the engine should."""
    rows = []
    with torch.no_grad():
        for ids, tt, norm in zip(sequences, types, normalize):
            kwargs: dict[str, Any] = {"input_ids": torch.tensor(ids[None], dtype=torch.long)}
            if family.uses_token_types:
                kwargs["token_type_ids"] = torch.tensor(tt[None], dtype=torch.long)
            out = model(**kwargs)
            if family.name == "qwen3_reranker":
                last = out.logits[0, -1]
                row = (last[YES_ID] - last[NO_ID]).reshape(1)
            elif family.pooling is None:
                row = out.logits[0]
            else:
                hidden = out.last_hidden_state[0]
                row = {"cls": hidden[0], "mean": hidden.mean(0), "lasttoken": hidden[-1]}[family.pooling]
                if norm:
                    row = torch.nn.functional.normalize(row, dim=0)
            rows.append(row.float().numpy())
    return np.stack(rows)
