"""Long inputs embedded in windows (opt-in): what vLLM calls chunked processing.

An input longer than the model's limit is cut into consecutive windows of at most that many tokens;
a text keeps its tokenizer's special tokens ([CLS] ... [SEP], <s> ... </s>) around every window. All
windows of a request go out in one batch, unnormalised; each input's vector is the mean of its
windows' vectors weighted by their token counts, then normalised when the model (or request)
normalises. Inputs within the limit are one window, so they embed as usual.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from quiver.common.config import FrontendSettings
from quiver.common.model_info import KIND_EMBEDDING
from quiver.common.protocol import TASK_EMBED
from quiver.common.ragged import RaggedIds
from quiver.frontend import metrics
from quiver.frontend.errors import APIError
from quiver.frontend.pipeline import Timings
from quiver.frontend.service import Embeddings, Service, as_input_list, matryoshka, record_stages

def long_input_modes(settings: FrontendSettings) -> list[str]:
    """What an over-long input can meet here, the server's default first: error, truncate, split."""
    modes = ["error", "truncate", "split"]
    default = "split" if settings.split_long_inputs else "truncate" if settings.auto_truncate else "error"
    return [default] + [mode for mode in modes if mode != default]


@dataclass
class Windows:
    seqs: RaggedIds  # every window as its own sequence
    owner: np.ndarray  # int64 [windows]: the input each window belongs to
    num_inputs: int


def split_ids(ids: list[int], special: list[int], limit: int) -> list[list[int]]:
    """Windows of at most `limit` ids; the leading and trailing special tokens repeat around each one."""
    if len(ids) <= limit:
        return [ids]
    lead = next((i for i, flag in enumerate(special) if not flag), len(ids))
    trail = next((i for i, flag in enumerate(reversed(special)) if not flag), 0)
    head, body, tail = ids[:lead], ids[lead:len(ids) - trail], ids[len(ids) - trail:]
    room = limit - len(head) - len(tail)
    return [head + body[start:start + room] + tail for start in range(0, len(body), room)]


def weighted_mean(rows: np.ndarray, windows: Windows, normalize: bool) -> np.ndarray:
    """Each input's token-weighted mean of its windows' rows, L2-normalised when asked."""
    weights = windows.seqs.seq_lens.astype(np.float64)
    sums = np.zeros((windows.num_inputs, rows.shape[1]), dtype=np.float64)
    np.add.at(sums, windows.owner, rows.astype(np.float64) * weights[:, None])
    totals = np.bincount(windows.owner, weights=weights, minlength=windows.num_inputs)
    means = sums / totals[:, None]
    if normalize:
        means /= np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)
    return means.astype(np.float32)


async def make_windows(service: Service, inputs: object, prompt_name: str | None, instruction: str | None,
                       param: str) -> Windows:
    texts, id_lists = as_input_list(inputs)
    service.check_count(len(texts if texts is not None else id_lists), param)
    limit = service.info.max_input_length
    per_input: list[list[list[int]]] = []
    if texts is not None:
        service.check_texts(texts, param)
        prefix = service.input_prefix(prompt_name, instruction)
        encodings = await asyncio.to_thread(service.tokenizer.plain.encode_batch_fast,
                                            [prefix + text for text in texts], add_special_tokens=True)
        special_room = max((sum(e.special_tokens_mask) for e in encodings), default=0)
        if special_room >= limit:
            raise APIError("validation", f"the tokenizer's special tokens leave no room within {limit} tokens",
                           param=param)
        per_input = [split_ids(e.ids, e.special_tokens_mask, limit) for e in encodings]
    else:
        per_input = [split_ids(list(ids), [0] * len(ids), limit) for ids in id_lists]
    flat = [window for windows in per_input for window in windows]
    owner = np.repeat(np.arange(len(per_input)), [len(windows) for windows in per_input])
    if texts is not None:
        if any(not window for window in flat):
            raise APIError("empty_input", "an input has no tokens", param=param)
        seqs = RaggedIds.from_lists(flat)
    else:
        seqs = service.tokenizer.check_ids(flat, False, "right", param)  # ids in the vocabulary, lengths fit
    return Windows(seqs, owner, len(per_input))


async def embed_split(service: Service, inputs: object, *, route: str, truncate: bool | None, direction: str,
                      prompt_name: str | None, normalize: bool, dimensions: int | None, param: str,
                      instruction: str | None = None, encoding_format: str = "float") -> Embeddings:
    """Service.embed's contract, with over-long inputs windowed instead of refused or truncated."""
    timings = Timings(started=time.monotonic())
    service.require_kind(KIND_EMBEDDING, route)
    service.check_dimensions(dimensions)
    service.check_encoding_format(encoding_format)
    windows = await make_windows(service, inputs, prompt_name, instruction, param)
    timings.tokenization_s = time.monotonic() - timings.started
    metrics.INPUT_TOKENS_BY[route].observe(windows.seqs.num_tokens)
    metrics.INPUTS_BY[route].observe(windows.num_inputs)
    rows = await service.pipeline.run(windows.seqs, TASK_EMBED, False, timings)
    record_stages(route, timings, service.model_name)
    return Embeddings(matryoshka(weighted_mean(rows, windows, normalize), dimensions, normalize),
                      windows.seqs.num_tokens, timings)
