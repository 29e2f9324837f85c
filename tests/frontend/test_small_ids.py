"""Small requests are checked by small_ragged instead of RaggedIds.validate: the same ids, or the same
error, whichever path they take."""

from __future__ import annotations

import asyncio
import functools
from typing import Any, Callable

import numpy as np
import pytest

from quiver.common.model_info import default_model_dir, load_model_info
from quiver.common.ragged import RaggedIds, RaggedLimits
from quiver.frontend import tokenization
from quiver.frontend.connections import HeadHoldingTransport
from quiver.frontend.errors import APIError
from quiver.frontend.schemas import EmbeddingRequest, TokenIdList, TokenIdLists
from quiver.frontend.tokenization import SMALL_IDS, TextTokenizer, small_ragged


@pytest.fixture(scope="module")
def tokenizer() -> TextTokenizer:
    return TextTokenizer(load_model_info(default_model_dir()), pool_threads=1)


def outcome(call: Callable[[], RaggedIds]) -> tuple[Any, ...]:
    """What a check gives: its ids, lengths and dtype, or its error's reason and message."""
    try:
        ids = call()
    except APIError as error:
        return ("error", error.reason, error.message, error.param)
    return ("ids", ids.input_ids.dtype, ids.input_ids.tolist(), ids.seq_lens.tolist())


def both_paths(monkeypatch: pytest.MonkeyPatch, call: Callable[[], RaggedIds]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    small = outcome(call)
    monkeypatch.setattr(tokenization, "SMALL_IDS", -1)  # every request takes the full path
    full = outcome(call)
    monkeypatch.undo()
    return small, full


def id_inputs(vocab: int, limit: int) -> list[list[list[int]]]:
    return [
        [[1, 2, 3]],
        [[5] * limit],
        [[1, 2], [3], [4, 5, 6]],
        [[1], []],
        [[]],
        [[vocab - 1, vocab]],
        [[3, -1]],
        [[2, 2**63]],
        [[2, 2**64 + 5]],
        [[1], list(range(1, limit + 3))],
    ]


@pytest.mark.parametrize("truncate", [False, True])
@pytest.mark.parametrize("direction", ["right", "Left"])
def test_token_ids_meet_the_same_checks_on_both_paths(tokenizer: TextTokenizer, monkeypatch: pytest.MonkeyPatch,
                                                      truncate: bool, direction: str) -> None:
    for rows in id_inputs(tokenizer.info.vocab_size, tokenizer.max_length):
        small, full = both_paths(monkeypatch, functools.partial(tokenizer.check_ids, rows, truncate, direction))
        assert small == full, rows


@pytest.mark.parametrize("truncate", [False, True])
@pytest.mark.parametrize("direction", ["right", "Left"])
def test_validated_token_ids_meet_the_same_checks_as_a_plain_list(tokenizer: TextTokenizer, truncate: bool,
                                                                  direction: str) -> None:
    """A flat input validated by the request model (a TokenIdList, its ids converted already) gives what
    the same ids as a plain list give, on the small and the full path alike."""
    vocab, limit = tokenizer.info.vocab_size, tokenizer.max_length
    for ids in ([1, 2, 3], [5] * limit, [5] * (limit + 1), [vocab - 1, vocab], [3, -1], [0, 7],
                list(range(1, SMALL_IDS + 50)), [2**31 - 1]):
        taken = EmbeddingRequest.model_validate({"input": ids}).input
        assert isinstance(taken, TokenIdList)
        fast = outcome(functools.partial(tokenizer.check_ids, [taken], truncate, direction))
        assert fast == outcome(functools.partial(tokenizer.check_ids, [list(ids)], truncate, direction)), ids


@pytest.mark.parametrize("truncate", [False, True])
@pytest.mark.parametrize("direction", ["right", "Left"])
def test_validated_lists_of_token_ids_meet_the_same_checks_as_plain_lists(tokenizer: TextTokenizer, truncate: bool,
                                                                         direction: str) -> None:
    """Lists of ids validated by the request model (a TokenIdLists, converted already) give what the same
    lists give as plain lists, whichever row is at fault."""
    vocab, limit = tokenizer.info.vocab_size, tokenizer.max_length
    for rows in ([[1, 2, 3]], [[5] * limit], [[1, 2], [5] * (limit + 1)], [[5] * (limit + 1), [2]],
                 [[1], [2, vocab], [3]], [[3, -1], [4]], [[0, 7], [1]], [list(range(1, SMALL_IDS + 50))],
                 [[2**31 - 1]], [[4, 5, 6]] * 40):
        taken = EmbeddingRequest.model_validate({"input": rows}).input
        assert isinstance(taken, TokenIdLists)
        fast = outcome(functools.partial(tokenizer.check_ids, taken, truncate, direction))
        assert fast == outcome(functools.partial(tokenizer.check_ids, [list(row) for row in rows], truncate,
                                                 direction)), rows


def test_texts_and_pairs_meet_the_same_checks_on_both_paths(tokenizer: TextTokenizer,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    long_text = "word " * (tokenizer.max_length + 50)
    for texts, truncate, with_types in [(["a short text", "another one"], False, False), ([long_text], False, False),
                                        ([long_text], True, False), ([("a query", "a document")], False, True)]:
        small, full = both_paths(monkeypatch, functools.partial(tokenizer.encode_sync, texts, truncate, "right",
                                                                with_types=with_types))
        assert small == full, texts
    pair = tokenizer.encode_sync([("a query", "a document")], False, "right", with_types=True)
    assert pair.token_type_ids is not None and pair.token_type_ids.dtype == np.int32
    assert set(pair.token_type_ids.tolist()) == {0, 1}


def test_large_or_unusual_requests_take_the_full_path() -> None:
    limits = RaggedLimits(vocab_size=100, max_length=SMALL_IDS + 1)
    assert small_ragged([[1] * (SMALL_IDS + 1)], None, limits) is None
    assert small_ragged([[1, 2]], [[0]], limits) is None  # segment ids that do not fit the ids
    assert small_ragged([[1, 2]], None, RaggedLimits(vocab_size=100, type_vocab_size=2)) is None
    assert small_ragged([[1], [2]], None, RaggedLimits(max_rows=1)) is None
    made = small_ragged([[1, 2], [3]], [[0, 1], [0]], limits)
    assert isinstance(made, RaggedIds) and made.seq_lens.tolist() == [2, 1] and made.offsets.tolist() == [0, 2, 3]


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info {name}"


def test_a_response_head_leaves_with_its_body() -> None:
    async def run() -> None:
        inner = RecordingTransport()
        transport = HeadHoldingTransport(inner, asyncio.get_running_loop())  # type: ignore[arg-type]
        transport.write(b"not held")
        transport.hold_next = True
        transport.write(b"head ")
        assert inner.writes == [b"not held"]
        transport.write(memoryview(b"body"))
        assert inner.writes == [b"not held", b"head body"]
        transport.hold_next = True
        transport.write(b"a head alone")
        await asyncio.sleep(0)  # the end of this turn of the loop sends it
        assert inner.writes[-1] == b"a head alone"
        transport.hold_next = True
        transport.write(b"last")
        transport.close()
        assert inner.writes[-1] == b"last" and inner.closed
        assert transport.get_extra_info("socket") == "info socket"
        await asyncio.sleep(0)
        assert inner.writes.count(b"last") == 1

    asyncio.run(run())
