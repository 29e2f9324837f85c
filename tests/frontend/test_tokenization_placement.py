"""Where tokenization runs: on the event loop for small work of a lone online request, on the request
pool when other requests share the loop or the work is large, on the background pool for bulk work;
the ids are the same wherever they were made."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from quiver.common.model_info import default_model_dir, load_model_info
from quiver.frontend.tokenization import (
    ALONE, BACKGROUND, ON_LOOP_CHARS, SHARED, THREAD_THRESHOLD_CHARS, LoopUse, TextTokenizer, loop_use,
)

WORDS = "the quick brown fox jumps over the lazy dog while search stacks rebuild their indexes "


def text_of(chars: int) -> str:
    return (WORDS * (chars // len(WORDS) + 1))[:chars]


@pytest.fixture(scope="module")
def tokenizer_and_use() -> tuple[TextTokenizer, list[LoopUse]]:
    use: list[LoopUse] = [ALONE]
    tokenizer = TextTokenizer(load_model_info(default_model_dir()), pool_threads=2, loop_use=lambda: use[0])
    return tokenizer, use


@pytest.mark.parametrize(("use", "chars", "where"), [
    (ALONE, ON_LOOP_CHARS - 10, "loop"),
    (SHARED, ON_LOOP_CHARS - 10, "loop"),  # too small to be worth the hand-off, whoever waits
    (BACKGROUND, ON_LOOP_CHARS - 10, "loop"),
    (ALONE, 2000, "loop"),  # a lone online request: the loop has nothing else to do
    (SHARED, 2000, "tokenize"),  # others are in flight: the loop stays free for them
    (BACKGROUND, 2000, "tokenize-background"),  # bulk work never queues ahead of online work
    (ALONE, THREAD_THRESHOLD_CHARS + 10, "tokenize"),
    (BACKGROUND, THREAD_THRESHOLD_CHARS + 10, "tokenize-background"),
])
def test_tokenization_runs_where_it_holds_up_no_one(tokenizer_and_use: tuple[TextTokenizer, list[LoopUse]],
                                                   use: LoopUse, chars: int, where: str) -> None:
    tokenizer, current = tokenizer_and_use
    current[0] = use
    text = text_of(chars)
    threads: list[str] = []

    def work() -> np.ndarray:
        threads.append(threading.current_thread().name)
        return tokenizer.encode_sync([text], True, "right").input_ids

    async def run() -> np.ndarray:
        loop_thread = threading.current_thread().name
        ids = await tokenizer.off_loop(len(text), work)
        threads[0] = "loop" if threads[0] == loop_thread else threads[0].rpartition("_")[0]
        return ids

    ids = asyncio.run(run())
    assert threads == [where]
    np.testing.assert_array_equal(ids, tokenizer.encode_sync([text], True, "right").input_ids)


def test_token_ids_leave_the_loop_by_size_only(tokenizer_and_use: tuple[TextTokenizer, list[LoopUse]]) -> None:
    """Checking ids costs a fraction of tokenizing text per item: a shared loop keeps them up to the threshold."""
    tokenizer, current = tokenizer_and_use
    current[0] = SHARED
    loop_thread: list[str] = []

    async def run(count: int) -> str:
        loop_thread.append(threading.current_thread().name)
        seqs = [[7] * count]
        used: list[str] = []
        await tokenizer.off_loop(count, lambda: used.append(threading.current_thread().name), by_size_only=True)
        ids = await tokenizer.ids(seqs, True, "right")
        assert ids.num_tokens == min(count, tokenizer.max_length)
        return used[0]

    assert asyncio.run(run(2000)) == loop_thread[-1]
    assert asyncio.run(run(THREAD_THRESHOLD_CHARS + 10)).startswith("tokenize_")


@pytest.mark.parametrize(("background", "inflight", "own", "use"), [
    (False, 300, 300, ALONE),  # only this request's own tokens are in flight
    (False, 0, 0, ALONE),  # no reservation at all (no ticket)
    (False, 301, 300, SHARED),  # someone else holds tokens too (another request, a batch job)
    (True, 0, 0, BACKGROUND),  # bulk work, whatever else is in flight
    (True, 900, 300, BACKGROUND),
])
def test_who_the_loop_serves(background: bool, inflight: int, own: int, use: LoopUse) -> None:
    assert loop_use(background, inflight, own) == use
