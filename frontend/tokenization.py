"""Text, text-pair and token-id inputs turned into flat int32 sequences, with truncation and limits.

Three copies of the model's tokenizer are kept (no truncation, truncation on the right, on the left)
so that one request's choice never changes another's. Tokenization runs on a bounded thread pool,
off the event loop (the tokenizers library releases the GIL and parallelises inside encode_batch).
Small work stays on the loop where the hand-off would cost more than it saves: always under
ON_LOOP_CHARS, and under THREAD_THRESHOLD_CHARS when the loop has nothing else to do (a lone online
request). A 512-token text takes about 0.5-1 ms to tokenize, a stretch in which the loop serves no one
else, so with other requests in flight, or for background work (bulk jobs), it goes to a pool. Background
work has a pool of its own, so that a batch job's lines never queue ahead of an online request's.

Every call but /tokenize's uses encode_batch_fast, which leaves out the character offsets of each token
(40 % of encode_batch's time on 50 pairs of 512 tokens, bench/pair_tokenization.py); /tokenize answers
with the offsets, so it keeps encode_batch.

Inputs come in three shapes: single texts (embedders, classifiers), pairs laid out by the tokenizer's
own pair template with segment ids (cross-encoders: "[CLS] a [SEP] b [SEP]"), and prompts cut into a
fixed prefix, a body and a fixed suffix (Qwen3-Reranker), where truncation shortens the body only.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from typing import Callable, Literal, Sequence, TypeVar, Union

import numpy as np
import orjson
from tokenizers import Encoding, Tokenizer

from quiver.common.model_info import ModelInfo
from quiver.common.ragged import EMPTY_ROW, OUT_OF_VOCABULARY, TOO_LONG, RaggedError, RaggedIds, RaggedLimits
from quiver.frontend.errors import APIError
from quiver.frontend.keep_awake import CountedPool
from quiver.frontend.schemas import TokenIdList, TokenIdLists
from quiver.frontend.tracing import record_tokenization

# Above this many characters in one call, tokenization always leaves the event loop for the pool; under
# ON_LOOP_CHARS (about 120 µs of tokenizing) it always stays on the loop, about the cost of the hand-off.
THREAD_THRESHOLD_CHARS = 4096
ON_LOOP_CHARS = 512
BACKGROUND_POOL_THREADS = 2
# Up to this many ids a request's rows are checked by small_ragged (see there); past it by RaggedIds.validate.
SMALL_IDS = 2048
# Token ids converted to an array while the request was validated (schemas.TokenIdList, TokenIdLists) are
# checked by one reduction over the array: up to this many (1 MiB of int32) it costs about the pool's hand-off.
CONVERTED_IDS_ON_LOOP = 262_144

# Who the event loop serves when tokenization work comes: a lone online request, online requests beside
# others, or background work.
LoopUse = Literal["alone", "shared", "background"]
ALONE: LoopUse = "alone"
SHARED: LoopUse = "shared"
BACKGROUND: LoopUse = "background"


def loop_use(background: bool, inflight_tokens: int, own_tokens: int) -> LoopUse:
    """Background work; or an online request that shares the event loop with others (tokens are in flight
    beside its own, a batch runner's included); or one alone."""
    if background:
        return BACKGROUND
    return SHARED if inflight_tokens > own_tokens else ALONE

TextInput = Union[str, tuple[str, str]]
T = TypeVar("T")


def _normalise_direction(direction: str) -> str:
    return direction.lower()


def small_ragged(rows: Sequence[Sequence[int]], types: Sequence[Sequence[int]] | None,
                 limits: RaggedLimits) -> RaggedIds | None:
    """`rows` (with their segment ids `types`) as int32 ragged ids when they hold at most SMALL_IDS ids and
    pass every check RaggedIds.validate makes under `limits`; None otherwise, and the caller takes the full
    path, which names the failure. The lengths are checked as a Python list and the ids with one numpy
    reduction instead of validate's five: at batch-1 sizes each reduction's fixed cost is what counts."""
    lens = list(map(len, rows))
    if not lens or (limits.max_rows is not None and len(lens) > limits.max_rows) or limits.type_vocab_size is not None:
        return None
    total = sum(lens)
    if total > SMALL_IDS or min(lens) < 1 or (limits.max_length is not None and max(lens) > limits.max_length):
        return None
    if types is not None and list(map(len, types)) != lens:
        return None
    try:
        ids = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=total)
        token_types = None if types is None else np.fromiter(itertools.chain.from_iterable(types), dtype=np.int32,
                                                             count=total)
    except OverflowError:  # a number beyond int64 (or a segment id beyond int32)
        return None
    # Seen as unsigned, a negative id is larger than any vocabulary: one reduction checks both bounds.
    if limits.vocab_size is not None and int(ids.view(np.uint64).max()) >= limits.vocab_size:
        return None
    return RaggedIds(ids.astype(np.int32), np.array(lens, dtype=np.int32), token_types)


def _converted(seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, list[int]] | None:
    """The int32 ids and lengths of token-id inputs converted while the request was validated (a
    TokenIdLists, or one TokenIdList); None for any other inputs."""
    if isinstance(seqs, TokenIdLists):
        return seqs.ids, seqs.lens
    if len(seqs) == 1 and isinstance(seqs[0], TokenIdList):
        return seqs[0].ids, [seqs[0].ids.size]
    return None


def _cut(ids: list[int], limit: int, direction: str) -> list[int]:
    """The first (direction right) or last (left) `limit` items."""
    limit = max(limit, 0)
    return ids[:limit] if _normalise_direction(direction) == "right" else ids[len(ids) - limit:]


class TextTokenizer:
    def __init__(self, info: ModelInfo, pool_threads: int = 4, loop_use: Callable[[], LoopUse] = lambda: ALONE) -> None:
        self.info = info
        self.pool = CountedPool(max(1, pool_threads), thread_name_prefix="tokenize")
        self.background_pool = CountedPool(BACKGROUND_POOL_THREADS, thread_name_prefix="tokenize-background")
        self.loop_use = loop_use
        self.max_length = info.max_input_length
        serialized = Tokenizer.from_file(str(info.tokenizer_path)).to_str()
        self.plain = Tokenizer.from_str(serialized)
        self.plain.no_truncation()
        self.plain.no_padding()
        self.truncating = {}
        for direction in ("right", "left"):
            tok = Tokenizer.from_str(serialized)
            tok.no_padding()
            tok.enable_truncation(self.max_length, direction=direction)
            self.truncating[direction] = tok
        self._fixed: dict[str, list[int]] = {}
        self.limits = RaggedLimits(vocab_size=info.vocab_size, max_length=self.max_length)
        self.vocabulary_limits = RaggedLimits(vocab_size=info.vocab_size)  # what ids checked before truncation meet

    def close(self) -> None:
        """Stop both pools, dropping work not yet started."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.background_pool.shutdown(wait=False, cancel_futures=True)

    @functools.cached_property
    def wrapper_ids(self) -> tuple[list[int], list[int]]:
        """The special tokens this tokenizer puts before and after one text."""
        encoding = self.plain.encode("x", add_special_tokens=True)
        mask = encoding.special_tokens_mask
        first = next((i for i, special in enumerate(mask) if not special), len(mask))
        last = max((i for i, special in enumerate(mask) if not special), default=first - 1)
        return encoding.ids[:first], encoding.ids[last + 1:]

    def _fixed_ids(self, text: str) -> list[int]:
        """Ids of a template's fixed part (no special tokens added), tokenized once."""
        if text not in self._fixed:
            self._fixed[text] = self.plain.encode(text, add_special_tokens=False).ids
        return self._fixed[text]

    def _pick(self, truncate: bool, direction: str) -> Tokenizer:
        return self.truncating[_normalise_direction(direction)] if truncate else self.plain

    def encode_sync(self, texts: list[TextInput], truncate: bool, direction: str, param: str = "input",
                    with_types: bool = False, first_row: int = 0) -> RaggedIds:
        """Texts, or (a, b) pairs in the tokenizer's pair template; segment ids when with_types. Errors
        name an input by its index plus first_row (the request's index of texts[0])."""
        encodings = self._pick(truncate, direction).encode_batch_fast(texts, add_special_tokens=True)
        return self._ragged([e.ids for e in encodings], [e.type_ids for e in encodings] if with_types else None,
                            param, first_row)

    async def encode(self, texts: list[TextInput], truncate: bool, direction: str, param: str = "input",
                     with_types: bool = False, first_row: int = 0) -> RaggedIds:
        return await self.off_loop(_chars(texts),
                                    lambda: self.encode_sync(texts, truncate, direction, param, with_types, first_row))

    def encode_prompts_sync(self, prefix: str, bodies: list[str], suffix: str, truncate: bool, direction: str,
                            param: str, first_row: int = 0) -> RaggedIds:
        """prefix + body + suffix per body, each part tokenized alone; truncation cuts the body only."""
        head, tail = self._fixed_ids(prefix), self._fixed_ids(suffix)
        room = self.max_length - len(head) - len(tail)
        ids = []
        for body in self.plain.encode_batch_fast(bodies, add_special_tokens=True):
            middle = _cut(body.ids, room, direction) if truncate and len(body.ids) > room else body.ids
            ids.append(head + middle + tail)
        return self._ragged(ids, None, param, first_row)

    async def encode_prompts(self, prefix: str, bodies: list[str], suffix: str, truncate: bool, direction: str,
                             param: str, first_row: int = 0) -> RaggedIds:
        return await self.off_loop(sum(len(b) for b in bodies), lambda: self.encode_prompts_sync(
            prefix, bodies, suffix, truncate, direction, param, first_row))

    def _ragged(self, rows: list[list[int]], types: list[list[int]] | None, param: str, first_row: int) -> RaggedIds:
        """Tokenized rows (and segment ids) as int32 ragged ids within the model's limits, or the APIError
        that says why not (see _checked)."""
        small = small_ragged(rows, types, self.limits)
        return small if small is not None else self._checked(RaggedIds.from_lists(rows, types), param,
                                                             first_row=first_row)

    def _checked(self, seqs: RaggedIds, param: str, limits: RaggedLimits | None = None,
                 empty: str = "has no tokens", first_row: int = 0) -> RaggedIds:
        """`seqs` once validated against the model's limits (or `limits`), or the APIError that says why
        not; `empty` completes "input N ..." for an input without tokens; N counts from first_row."""
        limits = self.limits if limits is None else limits
        try:
            seqs.validate(limits)
        except RaggedError as exc:
            row = None if exc.row is None else exc.row + first_row
            if exc.code == EMPTY_ROW:
                raise APIError("empty_input", f"input {row} {empty}", param=param) from exc
            if exc.code == OUT_OF_VOCABULARY:
                raise self._out_of_vocabulary(row, exc.value, param) from exc
            if exc.code == TOO_LONG:
                raise self._too_long(row, exc.value, param) from exc
            raise
        return seqs

    def _out_of_vocabulary(self, index: int | None, token_id: int | None, param: str) -> APIError:
        return APIError("token_out_of_vocabulary",
                        f"input {index} holds token id {token_id}, outside the vocabulary [0, {self.info.vocab_size})",
                        param=param)

    def _too_long(self, index: int | None, length: int | None, param: str) -> APIError:
        return APIError(
            "input_too_long",
            f"input {index} has {length} tokens, more than the model's limit of {self.max_length}; "
            f"shorten it or set truncate to true",
            param=param,
        )

    async def ids(self, seqs: list[list[int]], truncate: bool, direction: str, param: str = "input") -> RaggedIds:
        """check_ids, on the pool when the request holds many ids. Ids converted while the request was
        validated need numpy's passes only, so they stay on the loop up to CONVERTED_IDS_ON_LOOP."""
        converted = _converted(seqs)
        if converted is not None and converted[0].size <= CONVERTED_IDS_ON_LOOP:
            size = 0
        else:
            size = sum(len(seq) for seq in seqs)
        return await self.off_loop(size, lambda: self.check_ids(seqs, truncate, direction, param), by_size_only=True)

    def check_ids(self, seqs: list[list[int]], truncate: bool, direction: str, param: str = "input") -> RaggedIds:
        """Token-id inputs, taken as they are (no special tokens added), checked whole, then truncated."""
        vocab = self.info.vocab_size
        limits = self.vocabulary_limits if truncate else self.limits
        converted = _converted(seqs)
        if converted is not None:
            return self._checked_converted(*converted, truncate, direction, param, limits)
        small = small_ragged(seqs, None, limits)
        if small is not None:
            if truncate and any(len(seq) > self.max_length for seq in seqs):
                small = small.truncated(self.max_length, _normalise_direction(direction))
            return small
        try:
            ids = RaggedIds.from_lists(seqs, dtype=np.int64)
        except OverflowError as exc:  # an id beyond int64, e.g. 2**63: out of any vocabulary
            index, bad = next((i, x) for i, seq in enumerate(seqs) for x in seq if not 0 <= x < vocab)
            raise self._out_of_vocabulary(index, bad, param) from exc
        ids = self._checked(ids, param, limits, empty="is an empty list of token ids")
        if truncate:
            ids = ids.truncated(self.max_length, _normalise_direction(direction))
        return ids.with_dtype(np.int32)

    def _checked_converted(self, ids: np.ndarray, lens: list[int], truncate: bool, direction: str, param: str,
                           limits: RaggedLimits) -> RaggedIds:
        """Inputs' int32 ids and lengths, converted while the request was validated (schemas.TokenIdList and
        TokenIdLists), as check_ids takes them: one reduction on the good path (as small_ragged's),
        RaggedIds.validate's error on any other. The ids are not copied unless truncated."""
        seqs = RaggedIds(ids, np.array(lens, dtype=np.int32))
        fits = limits.max_length is None or max(lens) <= limits.max_length
        # Seen as unsigned, a negative id is larger than any vocabulary: one reduction checks both bounds.
        if not (fits and min(lens) >= 1 and int(ids.view(np.uint32).max()) < self.info.vocab_size):
            seqs = self._checked(seqs, param, limits, empty="is an empty list of token ids")
        if truncate:
            seqs = seqs.truncated(self.max_length, _normalise_direction(direction))
        return seqs

    async def tokens_json(self, texts: list[str], add_special_tokens: bool, max_tokens: int) -> bytes:
        """TEI's /tokenize answer as JSON bytes, made on the pool; 413 past `max_tokens` tokens in all."""
        return await self.off_loop(_chars(texts), lambda: self._tokens_json(texts, add_special_tokens, max_tokens))

    def _tokens_json(self, texts: list[str], add_special_tokens: bool, max_tokens: int) -> bytes:
        encodings = self.plain.encode_batch(texts, add_special_tokens=add_special_tokens)
        total = sum(len(encoding.ids) for encoding in encodings)
        if total > max_tokens:
            raise APIError("response_too_large", f"the inputs hold {total} tokens; /tokenize returns at most "
                           f"{max_tokens} in one request", param="inputs")
        return orjson.dumps([_token_list(text, encoding) for text, encoding in zip(texts, encodings)])

    async def off_loop(self, chars: int, work: Callable[[], T], by_size_only: bool = False) -> T:
        """Run tokenization work on a pool unless it is too small to be worth the hand-off (see the module's
        docstring for when that is). by_size_only: token ids, a fraction of a text's cost per item, leave the
        loop above THREAD_THRESHOLD_CHARS ids only."""
        started = time.monotonic()
        try:
            if chars <= ON_LOOP_CHARS or (by_size_only and chars <= THREAD_THRESHOLD_CHARS):
                return work()
            use = self.loop_use()
            if use == BACKGROUND:
                return await asyncio.get_running_loop().run_in_executor(self.background_pool, work)
            if use == SHARED or chars > THREAD_THRESHOLD_CHARS:
                return await asyncio.get_running_loop().run_in_executor(self.pool, work)
            return work()
        finally:
            record_tokenization(started)


def _token_list(text: str, encoding: Encoding) -> list[dict]:
    """Each token with its id, text, whether it is special, and its character span."""
    tokens = []
    for token_id, token, special, (start, stop) in zip(
        encoding.ids, encoding.tokens, encoding.special_tokens_mask, encoding.offsets
    ):
        is_special = bool(special)
        tokens.append({
            "id": token_id,
            "text": token if is_special else text[start:stop],
            "special": is_special,
            "start": None if is_special else start,
            "stop": None if is_special else stop,
        })
    return tokens


def _chars(texts: list[TextInput] | list[str]) -> int:
    return sum(len(t) if isinstance(t, str) else len(t[0]) + len(t[1]) for t in texts)
