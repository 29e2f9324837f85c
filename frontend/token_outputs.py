"""Outputs made from every token's row (the "tokens" task): BGE-M3's dense, sparse and ColBERT vectors,
and plain token vectors.

A worker answers a "tokens" chunk with one row per token (common.protocol.Result with num_rows). For
BGE-M3 a row is [ColBERT vector | lexical weight], the sequence's first (CLS) row holding the
normalised dense vector instead (worker/engine/models/m3.py); for other embedders it is the final
hidden state. This module asks for those rows and cuts them into each input's outputs, as
FlagEmbedding's BGEM3FlagModel does: dense from CLS, ColBERT from every other token, sparse as the
largest weight per token id over the input's tokens, with the tokenizer's cls, eos, pad and unk
tokens dropped and zero weights left out.
"""

from __future__ import annotations

import functools
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from quiver.common.model_info import KIND_EMBEDDING, ModelInfo
from quiver.common.protocol import TASK_LEXICAL, TASK_TOKENS
from quiver.frontend import metrics
from quiver.frontend.errors import APIError
from quiver.frontend.pipeline import Timings
from quiver.frontend.service import Service, record_stages
from quiver.common.ragged import RaggedIds

# Token vectors one response may carry (/embed_all, ColBERT outputs), in numbers: about 160 MB of JSON.
# A request past it is refused (413) after tokenization, before any model work.
MAX_TOKEN_VECTOR_VALUES = 1 << 24

# The special tokens BGE-M3's sparse output leaves out (FlagEmbedding's unused_tokens).
SPARSE_DROPPED_TOKENS = ("cls_token", "eos_token", "pad_token", "unk_token")


@dataclass
class TokenRows:
    """Each input's token ids and rows, and the request's token count and timings; task: TASK_TOKENS (whole
    rows) or TASK_LEXICAL (each row's lexical weight alone)."""

    ids: list[np.ndarray]
    rows: list[np.ndarray]
    num_tokens: int
    timings: Timings
    task: str = TASK_TOKENS


def record_request(route: str, seqs: RaggedIds, timings: Timings, model: str) -> None:
    metrics.INPUT_TOKENS_BY[route].observe(seqs.num_tokens)
    metrics.INPUTS_BY[route].observe(seqs.num_seqs)
    record_stages(route, timings, model)


async def run_token_rows(service: Service, seqs: RaggedIds, timings: Timings, task: str = TASK_TOKENS) -> np.ndarray:
    """float32 [seqs.num_tokens, token_dim] (TASK_TOKENS) or [seqs.num_tokens, 1] (TASK_LEXICAL): every
    token's row, in input order."""
    results = await service.pipeline.run_results(seqs, task, False, timings)
    rows = np.concatenate([result.values for result in results], axis=0)
    width = service.info.token_dim if task == TASK_TOKENS else 1
    if rows.shape != (seqs.num_tokens, width):
        raise APIError("internal", f"the workers answered token rows of shape {rows.shape}, "
                       f"({seqs.num_tokens}, {width}) was due")
    return rows


async def token_rows(service: Service, inputs: object, *, route: str, truncate: bool | None, direction: str,
                     prompt_name: str | None, instruction: str | None, param: str,
                     returns_vectors: bool = True, lexical_only: bool = False) -> TokenRows:
    """Each input's token rows; returns_vectors: the answer holds a vector per token (bounded in size);
    lexical_only: only BGE-M3's lexical weights are wanted, so only they come back from the workers."""
    timings = Timings(started=time.monotonic())
    service.require_kind(KIND_EMBEDDING, route)
    seqs = await service.tokenize(inputs, truncate, direction, prompt_name, param, timings, instruction)
    if returns_vectors and seqs.num_tokens * service.info.hidden_size > MAX_TOKEN_VECTOR_VALUES:
        raise APIError("response_too_large", f"the inputs hold {seqs.num_tokens} tokens; one answer carries token "
                       f"vectors of at most {MAX_TOKEN_VECTOR_VALUES // service.info.hidden_size} tokens for this "
                       "model", param=param)
    task = TASK_LEXICAL if lexical_only else TASK_TOKENS
    rows = await run_token_rows(service, seqs, timings, task)
    record_request(route, seqs, timings, service.model_name)
    bounds = seqs.offsets[1:-1]  # each sequence's rows
    return TokenRows(np.split(seqs.input_ids, bounds), np.split(rows, bounds), seqs.num_tokens, timings, task)


def sparse_dropped_ids(info: ModelInfo) -> np.ndarray:
    """Ids of the tokenizer's cls, eos, pad and unk tokens, named in tokenizer_config.json (read once)."""
    return _special_ids(info.path, info.tokenizer_path)


@functools.lru_cache(maxsize=8)
def _special_ids(model_dir: Path, tokenizer_path: Path) -> np.ndarray:
    from tokenizers import Tokenizer

    try:
        config = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    vocab = Tokenizer.from_file(str(tokenizer_path)).get_vocab(with_added_tokens=True)
    ids = []
    for key in SPARSE_DROPPED_TOKENS:
        token = config.get(key)
        token = token.get("content") if isinstance(token, dict) else token
        if isinstance(token, str) and token in vocab:
            ids.append(vocab[token])
    return np.asarray(sorted(set(ids)), dtype=np.int64)


def lexical_weights(ids: np.ndarray, weights: np.ndarray, dropped: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(token ids ascending, the largest positive weight each has among the input's tokens)."""
    keep = (weights > 0) & ~np.isin(ids, dropped)
    ids, weights = ids[keep], weights[keep]
    if ids.size == 0:
        return ids.astype(np.int64), weights.astype(np.float32)
    order = np.lexsort((weights, ids))  # by id, the largest weight last within each id
    ids, weights = ids[order], weights[order]
    last = np.append(ids[1:] != ids[:-1], True)
    return ids[last].astype(np.int64), weights[last].astype(np.float32)


class M3Outputs:
    """BGE-M3's three outputs of some inputs' token rows, each cut from the rows when first read: a
    route asks for one or two of them. Rows of the lexical task give the sparse output only."""

    def __init__(self, service: Service, token_rows: TokenRows) -> None:
        self.info = service.info
        self.token_rows = token_rows

    @functools.cached_property
    def dense(self) -> np.ndarray:
        """float32 [num_inputs, hidden], normalised."""
        assert self.token_rows.task == TASK_TOKENS, "lexical rows hold no dense vector"
        hidden = self.info.hidden_size
        rows = self.token_rows.rows
        return (np.stack([r[0, :hidden] for r in rows]) if rows else np.zeros((0, hidden))).astype(np.float32)

    @functools.cached_property
    def sparse(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per input: (token ids ascending, weights); the weight is a token row's last column."""
        dropped = sparse_dropped_ids(self.info)
        return [lexical_weights(ids, rows[:, -1], dropped) for ids, rows in zip(self.token_rows.ids,
                                                                                self.token_rows.rows)]

    @functools.cached_property
    def colbert(self) -> list[np.ndarray]:
        """Per input: float32 [its tokens - 1, hidden], each row normalised."""
        assert self.token_rows.task == TASK_TOKENS, "lexical rows hold no ColBERT vectors"
        return [np.ascontiguousarray(rows[1:, :self.info.hidden_size]) for rows in self.token_rows.rows]
