"""Random-weight Hugging Face checkpoints written with transformers' own classes.

Used by the engine tests (tiny shapes, CPU) and the engine benchmark (real shapes, on the GPU): a
model's config.json and safetensors through save_pretrained, a word-level tokenizer.json built with
the tokenizers library (it contains "yes" and "no" for rerankers), and the sentence-transformers files
that say how to pool.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

YES_ID, NO_ID = 2, 3


def write_tokenizer(path: Path, vocab_size: int) -> None:
    """A whitespace word-level tokenizer: [PAD]=0, [UNK]=1, yes=2, no=3, then w4, w5, ..."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {"[PAD]": 0, "[UNK]": 1, "yes": YES_ID, "no": NO_ID}
    words.update({f"w{i}": i for i in range(4, min(vocab_size, 1000))})
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path / "tokenizer.json"))


def write_sentence_transformers_files(path: Path, pooling: str, normalize: bool, max_seq_length: int) -> None:
    modules: list[dict[str, Any]] = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (path / "2_Normalize").mkdir(exist_ok=True)
    (path / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    (path / "1_Pooling").mkdir(exist_ok=True)
    modes = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "lasttoken": "pooling_mode_lasttoken"}
    pooling_config = {name: name == modes[pooling] for name in modes.values()}
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config), encoding="utf-8")
    (path / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False}), encoding="utf-8"
    )


def save_checkpoint(model: Any, path: Path, pooling: str | None = None, normalize: bool = False) -> Path:
    """save_pretrained + tokenizer.json (+ sentence-transformers files when pooling is given)."""
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path), safe_serialization=True)
    config = model.config
    write_tokenizer(path, config.vocab_size)
    if pooling is not None:
        limit = config.max_position_embeddings - (2 if config.model_type in ("roberta", "xlm-roberta") else 0)
        write_sentence_transformers_files(path, pooling, normalize, limit)
    return path


def make_bidirectional(model: Any) -> Any:
    """Turn a transformers Qwen3 model's attention bidirectional (as pplx-embed runs it)."""
    model.config.is_causal = False
    for module in model.modules():
        if hasattr(module, "is_causal"):
            module.is_causal = False
    return model


def qwen3_0_6b_config(**overrides: Any) -> Any:
    """Qwen3-0.6B's shape (what pplx-embed-0.6B and Qwen3-Embedding-0.6B are built on)."""
    from transformers import Qwen3Config

    values = dict(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, attention_bias=False,
    )
    values.update(overrides)
    return Qwen3Config(**values)


def xlmr_large_config(**overrides: Any) -> Any:
    """XLM-RoBERTa large with BGE-M3's position table (8194)."""
    from transformers import XLMRobertaConfig

    values = dict(
        vocab_size=250002, hidden_size=1024, intermediate_size=4096, num_hidden_layers=24,
        num_attention_heads=16, max_position_embeddings=8194, type_vocab_size=1, pad_token_id=1,
        layer_norm_eps=1e-5, hidden_act="gelu",
    )
    values.update(overrides)
    return XLMRobertaConfig(**values)


# The two real-shape stand-ins of the benchmark: (transformers class, config factory, pooling).
BENCH_MODELS: dict[str, tuple[str, Any, str]] = {
    "qwen3-0.6b-bidirectional-mean": ("Qwen3Model", qwen3_0_6b_config, "mean"),
    "xlmr-large-cls": ("XLMRobertaModel", xlmr_large_config, "cls"),
}


def ensure_bench_checkpoint(
    name: str, root: Path, device: str = "cuda", overrides: dict[str, Any] | None = None
) -> Path:
    """Write the named random-weight checkpoint (bf16 safetensors) under root unless it is there.

    overrides change the config (e.g. fewer layers for a quick CPU run) and the directory name.
    """
    import torch
    import transformers

    suffix = "".join(f"-{k}{v}" for k, v in sorted((overrides or {}).items()))
    path = root / f"{name}{suffix}"
    if (path / "config.json").is_file() and (path / "tokenizer.json").is_file():
        return path
    cls_name, config_factory, pooling = BENCH_MODELS[name]
    config = config_factory(**(overrides or {}))
    torch.manual_seed(0)
    with torch.device(device):
        model = getattr(transformers, cls_name)(config)
    if cls_name.startswith("Qwen3"):
        make_bidirectional(model)
    model = model.to(torch.bfloat16)
    save_checkpoint(model, path, pooling=pooling, normalize=True)
    del model
    return path


def load_reference(path: Path, device: str, dtype: Any) -> Any:
    """transformers' own model from a bench checkpoint (bidirectional where the config says so)."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(path), dtype=dtype).to(device).eval()
    if getattr(model.config, "is_causal", True) is False:
        make_bidirectional(model)
    return model
