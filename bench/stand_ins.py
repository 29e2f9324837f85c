"""Random-weight stand-ins of the published models, for benchmarking the HTTP path on a GPU.

The weights and configs come from the engine benchmark's checkpoint builder
(bench.engine.checkpoints). Its word-level tokenizer maps real text to [UNK] — whose id is also
XLM-R's padding id, which shifts XLM-R's position ids in transformers — so each stand-in here gets a
byte-level BPE tokenizer trained on the benchmark corpus instead: real text then becomes varied ids,
and the special tokens take XLM-R's ids (<s>=0, <pad>=1, </s>=2, <unk>=3).

    python -m quiver.bench.stand_ins --root /tmp/ckpts pplx-embed-0.6b-shape bge-m3-shape   # prints the paths
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from quiver.bench.corpus import stdlib_documents
from quiver.bench.engine.checkpoints import ensure_bench_checkpoint, save_checkpoint, xlmr_large_config

SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>"]
TOKENIZER_VOCAB = 32000

# stand-in name → (builder, whether its tokenizer wraps texts in <s> ... </s> as XLM-R's does)
STAND_INS: dict[str, tuple[str, bool]] = {
    "pplx-embed-0.6b-shape": ("qwen3-0.6b-bidirectional-mean", False),
    "bge-m3-shape": ("xlmr-large-cls", True),
    "bge-reranker-v2-m3-shape": ("xlmr-large-reranker", True),
}

# Narrow two-layer versions of the same families, for trying the pipeline (and testing it) on a CPU.
SMALL_OVERRIDES: dict[str, dict[str, Any]] = {
    "qwen3-0.6b-bidirectional-mean": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=4096),
    "xlmr-large-cls": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           vocab_size=4096),
}
SMALL_OVERRIDES["xlmr-large-reranker"] = SMALL_OVERRIDES["xlmr-large-cls"]


def corpus_tokenizer(vocab_size: int, roberta_template: bool) -> Any:
    """A byte-level BPE tokenizer trained on the standard library's documentation (about a second)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(stdlib_documents(), trainer=trainer)
    if roberta_template:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    return tokenizer


def write_corpus_tokenizer(path: Path, roberta_template: bool) -> None:
    """Replace the checkpoint's tokenizer; tokenizer_config.json lets AutoTokenizer (sentence-transformers) load it."""
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    corpus_tokenizer(min(TOKENIZER_VOCAB, vocab), roberta_template).save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "pad_token": "<pad>", "padding_side": "right"}
    (path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")


def _reranker(root: Path, device: str, overrides: dict[str, Any]) -> Path:
    """XLM-R large with a one-label classification head: BGE-reranker-v2-m3's shape."""
    import torch
    from transformers import XLMRobertaForSequenceClassification

    suffix = "".join(f"-{k}{v}" for k, v in sorted(overrides.items()))
    path = root / f"xlmr-large-reranker{suffix}"
    if (path / "config.json").is_file():
        return path
    torch.manual_seed(0)
    with torch.device(device):
        model = XLMRobertaForSequenceClassification(xlmr_large_config(num_labels=1, **overrides))
    save_checkpoint(model.to(torch.bfloat16), path)
    return path


def build_stand_in(name: str, root: Path, device: str = "cuda", small: bool = False) -> Path:
    """Write (once) the named stand-in under root and return its directory; small: SMALL_OVERRIDES."""
    builder, roberta_template = STAND_INS[name]
    overrides = SMALL_OVERRIDES[builder] if small else {}
    if builder == "xlmr-large-reranker":
        path = _reranker(root, device, overrides)
    else:
        path = ensure_bench_checkpoint(builder, root, device, overrides or None)
    if not (path / "tokenizer_config.json").is_file():
        write_corpus_tokenizer(path, roberta_template)
        _complete_pooling_config(path)
    return path


def _complete_pooling_config(path: Path) -> None:
    """sentence-transformers needs the embedding width in 1_Pooling/config.json to load the checkpoint."""
    pooling = path / "1_Pooling" / "config.json"
    if pooling.is_file():
        values = json.loads(pooling.read_text())
        values.setdefault("word_embedding_dimension", json.loads((path / "config.json").read_text())["hidden_size"])
        pooling.write_text(json.dumps(values), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="+", choices=sorted(STAND_INS))
    parser.add_argument("--root", required=True, help="folder for the checkpoints")
    parser.add_argument("--device", default="cuda", help="where the random weights are drawn")
    parser.add_argument("--small", action="store_true", help="narrow two-layer versions, for a CPU")
    args = parser.parse_args()
    for name in args.names:
        print(build_stand_in(name, Path(args.root), args.device, args.small), flush=True)


if __name__ == "__main__":
    main()
