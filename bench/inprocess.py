"""Models run in this process: the float32 reference and the baselines a user would run instead.

`TransformersRunner` is Hugging Face transformers' own model class on the checkpoint, pooled and
normalised as the checkpoint's sentence-transformers files say (read through common.model_info), fed
by the same tokenizer.json the server uses. `SentenceTransformersRunner` is sentence-transformers'
encode() on the same directory. Both return float32 numpy rows, so a call's time includes the copy
back to the host, as a server's does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from quiver.bench.engine.checkpoints import load_reference, make_bidirectional
from quiver.common.model_info import DECODER_TYPES, KIND_CLASSIFIER, KIND_EMBEDDING, KIND_SPARSE, ModelInfo

def quiet_transformers() -> None:
    """No "Loading weights" progress bars from transformers in the benchmark's output."""
    from transformers.utils import logging

    logging.disable_progress_bar()


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class Unsupported(Exception):
    """This target cannot run this kind of request; the message says why (it goes into the report)."""


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str) -> str:
    return "float32" if device == "cpu" else "bfloat16"


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """[batch, tokens, hidden] → [batch, hidden] over right-padded rows (mask: 1 for real tokens)."""
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "mean":
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(1) / weights.sum(1)
    if pooling == "lasttoken":
        last = mask.sum(1) - 1
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    raise ValueError(f"unknown pooling {pooling!r}")


def _load_scorer(info: ModelInfo, device: str, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(info.path), dtype=dtype).to(device).eval()
    if info.model_type in DECODER_TYPES and not info.causal:
        make_bidirectional(model)
    return model


def _load_masked_lm(info: ModelInfo, device: str, dtype: torch.dtype) -> Any:
    from transformers import AutoModelForMaskedLM

    return AutoModelForMaskedLM.from_pretrained(str(info.path), dtype=dtype).to(device).eval()


class TransformersRunner:
    """transformers on one device; embeds token ids or texts (SPLADE: max over tokens of log(1 + relu) of
    the masked-LM logits, as dense rows of the vocabulary's width), or scores query/document pairs."""

    def __init__(self, info: ModelInfo, device: str, dtype: str) -> None:
        self.info = info
        self.device = device
        quiet_transformers()
        if info.kind == KIND_EMBEDDING:
            self.model = load_reference(info.path, device, DTYPES[dtype])
        elif info.kind == KIND_SPARSE:
            self.model = _load_masked_lm(info, device, DTYPES[dtype])
        elif info.kind == KIND_CLASSIFIER and info.num_labels == 1:
            self.model = _load_scorer(info, device, DTYPES[dtype])
        else:
            raise Unsupported(f"no transformers baseline for a {info.kind} model with {info.num_labels} labels")
        self.pad_id = int(info.config.get("pad_token_id") or 0)
        self.tokenizer = Tokenizer.from_file(str(info.tokenizer_path))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(info.max_input_length)
        self.prompt = info.prompts.get(info.default_prompt_name or "", "")
        self.uses_token_types = info.model_type == "bert"

    def _padded(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in rows)
        ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, row in enumerate(rows):
            ids[i, :len(row)] = row
            mask[i, :len(row)] = 1
        return torch.from_numpy(ids).to(self.device), torch.from_numpy(mask).to(self.device)

    @torch.inference_mode()
    def embed_ids(self, rows: np.ndarray | list[list[int]]) -> np.ndarray:
        if self.info.kind not in (KIND_EMBEDDING, KIND_SPARSE):
            raise Unsupported(f"the model is a {self.info.kind}, not an embedder")
        if isinstance(rows, np.ndarray):  # equal lengths: no mask, so attention can take its fastest kernel
            ids = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64)).to(self.device)
            mask, model_mask = torch.ones_like(ids), None
        else:
            ids, mask = self._padded(rows)
            model_mask = mask
        if self.info.kind == KIND_SPARSE:
            logits = self.model(input_ids=ids, attention_mask=model_mask).logits.float()
            weights = torch.log1p(torch.relu(logits)) * mask.unsqueeze(-1)
            return weights.amax(dim=1).cpu().numpy()
        hidden = self.model(input_ids=ids, attention_mask=model_mask).last_hidden_state
        pooled = pool(hidden, mask, self.info.pooling).float()
        if self.info.normalize:
            pooled = torch.nn.functional.normalize(pooled, dim=-1)
        return pooled.cpu().numpy()

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        """Tokenization included, with the prompt the server would add."""
        return self.embed_ids([e.ids for e in self.tokenizer.encode_batch([self.prompt + t for t in texts])])

    @torch.inference_mode()
    def score(self, query: str, documents: list[str]) -> np.ndarray:
        """Sigmoid scores of (query, document) pairs, as a TEI-style /rerank answers by default."""
        if self.info.kind != KIND_CLASSIFIER:
            raise Unsupported(f"the model is a {self.info.kind}, not a cross-encoder")
        encodings = self.tokenizer.encode_batch([(query, d) for d in documents])
        ids, mask = self._padded([e.ids for e in encodings])
        kwargs = {"input_ids": ids, "attention_mask": mask}
        if self.uses_token_types:
            types, _ = self._padded([e.type_ids for e in encodings])
            kwargs["token_type_ids"] = types
        logits = self.model(**kwargs).logits[:, 0].float()
        return torch.sigmoid(logits).cpu().numpy()

    def close(self) -> None:
        del self.model
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()


class SentenceTransformersRunner:
    """sentence-transformers' encode() on texts: its own tokenizer, pooling and normalisation."""

    def __init__(self, info: ModelInfo, device: str, dtype: str) -> None:
        if info.kind != KIND_EMBEDDING or not (info.path / "modules.json").is_file():
            raise Unsupported("the checkpoint has no sentence-transformers modules.json")
        from sentence_transformers import SentenceTransformer

        quiet_transformers()
        self.device = device
        self.model = SentenceTransformer(str(info.path), device=device, model_kwargs={"dtype": DTYPES[dtype]})
        self.model.to(DTYPES[dtype]).eval()
        if info.model_type in DECODER_TYPES and not info.causal:
            make_bidirectional(self.model[0].auto_model)

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        rows = self.model.encode(texts, batch_size=len(texts), convert_to_tensor=True, show_progress_bar=False)
        return rows.float().cpu().numpy()

    def close(self) -> None:
        del self.model
        if self.device.startswith("cuda"):
            torch.cuda.empty_cache()
