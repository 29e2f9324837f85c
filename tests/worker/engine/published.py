"""Published checkpoint layouts written at test time: tiny sizes, random weights, the real file names.

No machine here reaches a model hub, so each layout is rebuilt as its repository lays it out: the
config.json its model card ships (model_type, architectures, auto_map), model.safetensors, tokenizer
files and the sentence-transformers files. The reference models are transformers' own classes,
loaded from the same safetensors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.worker.engine.families import spread_weights

TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "a search stack calls the embedding server twice",
    "cats sleep for most of the day",
    "vector databases store embeddings of documents",
    "sleep",
    "the history of the roman empire in three volumes and an index of every emperor",
]

# Written into a published layout's remote-code files: running them leaves this file beside them.
REMOTE_CODE_MARKER = "remote_code_ran"


def write_word_tokenizer(path: Path, texts: list[str], specials: list[str], post_processor: Any = None) -> int:
    """A whitespace word-level tokenizer.json (+ tokenizer_config.json) knowing every word of texts."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {token: i for i, token in enumerate(specials)}
    for text in texts:
        for piece, _ in pre_tokenizers.Whitespace().pre_tokenize_str(text):
            words.setdefault(piece, len(words))
    tokenizer = Tokenizer(models.WordLevel(words, unk_token=specials[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    if post_processor is not None:
        tokenizer.post_processor = post_processor
    tokenizer.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": specials[0], "pad_token": specials[1]}
    (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return tokenizer.get_vocab_size()


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2), encoding="utf-8")


def _remote_code(path: Path, names: list[str]) -> None:
    """Remote-code modules named by an auto_map; importing one writes REMOTE_CODE_MARKER."""
    for name in names:
        (path / name).write_text(
            "from pathlib import Path\n"
            f"(Path(__file__).parent / {REMOTE_CODE_MARKER!r}).write_text('imported')\n",
            encoding="utf-8",
        )


# ---- pplx-embed ---------------------------------------------------------------------------------------

PPLX_MAX_POSITIONS = 128


def pplx_embed(root: Path, sizes: dict[str, Any] | None = None) -> Path:
    """perplexity-ai/pplx-embed-v1-0.6b's layout at tiny sizes, or at `sizes` (e.g. the real 0.6B widths,
    with transformers' own initialisation) for GPU runs.

    config.json: model_type "bidirectional_pplx_qwen3", architectures ["PPLXQwen3Model"],
    use_bidirectional_attention, an auto_map to configuration.py / modeling.py (never to be run);
    model.safetensors holds a Qwen3Model's tensors; modules.json: Transformer, mean Pooling, and the
    st_quantize.FlexibleQuantizer module (no Normalize: the native output is unnormalised).
    """
    from transformers import Qwen3Config, Qwen3Model

    path = root / "pplx-embed-v1-0.6b"
    path.mkdir(parents=True)
    vocab = write_word_tokenizer(path, TEXTS, ["<unk>", "<|endoftext|>"])
    shape = sizes or dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=16, max_position_embeddings=PPLX_MAX_POSITIONS)
    config = Qwen3Config(**{"vocab_size": vocab, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
                            "tie_word_embeddings": True, **shape})
    torch.manual_seed(3)
    model = Qwen3Model(config).eval() if sizes else spread_weights(Qwen3Model(config), seed=3)
    model.save_pretrained(str(path), safe_serialization=True)
    published = json.loads((path / "config.json").read_text())
    published.update({
        "model_type": "bidirectional_pplx_qwen3",
        "architectures": ["PPLXQwen3Model"],
        "use_bidirectional_attention": True,
        "auto_map": {"AutoConfig": "configuration.PPLXQwen3Config", "AutoModel": "modeling.PPLXQwen3Model"},
    })
    published.pop("is_causal", None)
    _write_json(path / "config.json", published)
    _remote_code(path, ["configuration.py", "modeling.py", "st_quantize.py"])
    _write_json(path / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Quantizer", "type": "st_quantize.FlexibleQuantizer"},
    ])
    _write_json(path / "1_Pooling" / "config.json", {
        "word_embedding_dimension": config.hidden_size, "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False, "pooling_mode_lasttoken": False,
        "include_prompt": True,
    })
    _write_json(path / "2_Quantizer" / "config.json", {"quantization": "int8"})
    _write_json(path / "config_sentence_transformers.json",
                {"prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine"})
    _write_json(path / "sentence_bert_config.json",
                {"max_seq_length": config.max_position_embeddings, "do_lower_case": False})
    return path


def pplx_reference(path: Path, token_ids: list[list[int]]) -> np.ndarray:
    """transformers' Qwen3Model on pplx-embed's tensors with an all-visible (bidirectional) mask, mean-pooled.

    The 4-D additive mask of zeros lets every token see every other, in every layer; the causal run
    beside it proves the mask took effect.
    """
    from transformers import Qwen3Config, Qwen3Model

    values = json.loads((path / "config.json").read_text())
    for key in ("model_type", "architectures", "auto_map", "use_bidirectional_attention"):
        values.pop(key)
    model = Qwen3Model.from_pretrained(str(path), config=Qwen3Config(**values), dtype=torch.float32).eval()
    rows = []
    with torch.no_grad():
        for ids in token_ids:
            input_ids = torch.tensor([ids])
            visible = torch.zeros(1, 1, len(ids), len(ids))
            hidden = model(input_ids=input_ids, attention_mask=visible).last_hidden_state[0]
            if len(ids) > 1:
                causal = model(input_ids=input_ids).last_hidden_state[0]
                assert not torch.allclose(causal[0], hidden[0], atol=1e-3), "the bidirectional mask had no effect"
            rows.append(hidden.mean(0).numpy())
    return np.stack(rows)


# ---- SPLADE -------------------------------------------------------------------------------------------

BERT_SPECIALS = ["[UNK]", "[PAD]", "[CLS]", "[SEP]", "[MASK]"]


def splade(root: Path, sizes: dict[str, Any] | None = None) -> Path:
    """naver/splade-v3's layout at tiny sizes: a BertForMaskedLM (MLM head under cls.predictions, its
    decoder tied to the word embeddings), a BERT tokenizer, and sentence-transformers' sparse-encoder
    modules (MLMTransformer, SpladePooling with max pooling and relu)."""
    from tokenizers import processors
    from transformers import BertConfig, BertForMaskedLM

    path = root / "splade-v3"
    path.mkdir(parents=True)
    template = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                             special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    vocab = write_word_tokenizer(path, TEXTS, BERT_SPECIALS, template)
    shape = sizes or dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                          max_position_embeddings=64)
    config = BertConfig(**{"vocab_size": vocab, "type_vocab_size": 2, "pad_token_id": 1, "tie_word_embeddings": True,
                           **shape})
    torch.manual_seed(5)
    model = BertForMaskedLM(config).eval() if sizes else spread_weights(BertForMaskedLM(config), seed=5)
    model.save_pretrained(str(path), safe_serialization=True)
    _write_json(path / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.sparse_encoder.models.MLMTransformer"},
        {"idx": 1, "name": "1", "path": "1_SpladePooling",
         "type": "sentence_transformers.sparse_encoder.models.SpladePooling"},
    ])
    _write_json(path / "1_SpladePooling" / "config.json", {
        "pooling_strategy": "max", "activation_function": "relu", "word_embedding_dimension": vocab})
    _write_json(path / "sentence_bert_config.json",
                {"max_seq_length": config.max_position_embeddings, "do_lower_case": False})
    return path


def splade_reference(path: Path, texts: list[str]) -> np.ndarray:
    """transformers' BertForMaskedLM in one padded batch: max over unpadded tokens of log(1 + relu(logits))."""
    from transformers import BertForMaskedLM, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"), pad_token="[PAD]")
    model = BertForMaskedLM.from_pretrained(str(path), dtype=torch.float32).eval()
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    weights = torch.log1p(torch.relu(logits)) * batch["attention_mask"].unsqueeze(-1)
    return weights.max(dim=1).values.numpy()


# ---- BGE-M3 -------------------------------------------------------------------------------------------

XLMR_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # XLM-RoBERTa's first ids
M3_MAX_POSITIONS = 66  # 64 tokens after RoBERTa's pad_token_id + 1 reserved positions


def bge_m3(root: Path, sizes: dict[str, Any] | None = None) -> Path:
    """BAAI/bge-m3's layout at tiny sizes: an XLMRobertaModel (model.safetensors), an XLM-R tokenizer
    template "<s> $A </s>" with its special tokens named in tokenizer_config.json, sentence-transformers'
    modules (CLS pooling, Normalize), and the two heads as FlagEmbedding saves them: torch.save of
    nn.Linear state dicts in sparse_linear.pt (hidden → 1) and colbert_linear.pt (hidden → hidden)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import XLMRobertaConfig, XLMRobertaModel

    path = root / "bge-m3"
    path.mkdir(parents=True)
    words = {token: i for i, token in enumerate(XLMR_SPECIALS)}
    for text in TEXTS:
        for piece, _ in pre_tokenizers.Whitespace().pre_tokenize_str(text):
            words.setdefault(piece, len(words))
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    tokenizer.save(str(path / "tokenizer.json"))
    _write_json(path / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "cls_token": "<s>", "eos_token": "</s>",
        "sep_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>", "model_max_length": 8192})
    shape = sizes or dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                          max_position_embeddings=M3_MAX_POSITIONS)
    config = XLMRobertaConfig(**{"vocab_size": len(words), "type_vocab_size": 1, "pad_token_id": 1,
                                 "bos_token_id": 0, "eos_token_id": 2, **shape})
    torch.manual_seed(7)
    model = XLMRobertaModel(config).eval() if sizes else spread_weights(XLMRobertaModel(config), seed=7)
    model.save_pretrained(str(path), safe_serialization=True)
    hidden = config.hidden_size
    colbert_linear, sparse_linear = torch.nn.Linear(hidden, hidden), torch.nn.Linear(hidden, 1)
    with torch.no_grad():  # a bias at the median weight of the texts' tokens: about half get none
        ids = [[0, *(words[w] for w, _ in pre_tokenizers.Whitespace().pre_tokenize_str(t)), 2] for t in TEXTS]
        states = torch.cat([model(input_ids=torch.tensor([i])).last_hidden_state[0] for i in ids])
        sparse_linear.bias.fill_(-float((states @ sparse_linear.weight[0]).median()))
    torch.save(colbert_linear.state_dict(), path / "colbert_linear.pt")
    torch.save(sparse_linear.state_dict(), path / "sparse_linear.pt")
    _write_json(path / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ])
    _write_json(path / "1_Pooling" / "config.json", {
        "word_embedding_dimension": hidden, "pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": False, "pooling_mode_mean_sqrt_len_tokens": False})
    _write_json(path / "sentence_bert_config.json", {"max_seq_length": config.max_position_embeddings - 2,
                                                      "do_lower_case": False})
    return path


def flag_m3_model(path: Path) -> Any:
    """FlagEmbedding's BGEM3FlagModel (M3Embedder) on the checkpoint, in float32 on the CPU.

    FlagEmbedding's package __init__ imports its rerankers and fine-tuning code too, which need
    libraries (and transformers internals) its embedder does not; the embedder's own modules are
    imported through bare parent packages instead, so the code that computes the reference is
    FlagEmbedding's own, unchanged.
    """
    import importlib
    import importlib.util
    import sys
    import types

    spec = importlib.util.find_spec("FlagEmbedding")
    assert spec is not None and spec.submodule_search_locations, "FlagEmbedding is not installed"
    package_root = Path(list(spec.submodule_search_locations)[0])
    for name in ("FlagEmbedding", "FlagEmbedding.abc", "FlagEmbedding.inference", "FlagEmbedding.inference.embedder",
                 "FlagEmbedding.inference.embedder.encoder_only", "FlagEmbedding.finetune",
                 "FlagEmbedding.finetune.embedder", "FlagEmbedding.finetune.embedder.encoder_only"):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(package_root.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = package
    m3 = importlib.import_module("FlagEmbedding.inference.embedder.encoder_only.m3")
    return m3.M3Embedder(str(path), use_fp16=False, devices="cpu")
