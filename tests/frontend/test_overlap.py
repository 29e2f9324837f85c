"""Where a long scoring request is cut (frontend/overlap.py), and how the share is learned."""

from __future__ import annotations

import pytest

from quiver.frontend.overlap import DEFAULT_SHARE, MAX_SHARE, MIN_CHARS, MIN_DOCUMENTS, MIN_SHARE, OverlapSplit


def documents(count: int, chars: int) -> list[str]:
    return ["w" * chars for _ in range(count)]


def test_short_requests_are_not_cut():
    split = OverlapSplit()
    assert split.cut(documents(MIN_DOCUMENTS - 1, 10_000)) == 0  # too few documents
    assert split.cut(documents(MIN_DOCUMENTS, MIN_CHARS // MIN_DOCUMENTS - 1)) == 0  # too few characters
    assert split.cut(documents(MIN_DOCUMENTS, MIN_CHARS // MIN_DOCUMENTS)) == 1


def test_the_default_share_sends_an_eighth_of_equal_documents_first():
    assert DEFAULT_SHARE == 1 / 8
    assert OverlapSplit().cut(documents(24, 1_000)) == 3
    assert OverlapSplit().cut(documents(50, 2_600)) == 7  # 6.25 documents' characters: the 7th reaches them


def test_the_cut_follows_characters_not_the_count():
    # One long document first holds more than a quarter of the characters on its own.
    texts = ["w" * 30_000] + documents(20, 3_000)
    assert OverlapSplit(share=1 / 4).cut(texts) == 1
    assert OverlapSplit(share=1 / 2).cut(texts) == 6  # 30,000 + 5 × 3,000 reach half of 90,000
    texts = documents(20, 3_000) + ["w" * 30_000]
    assert OverlapSplit(share=1 / 4).cut(texts) == 8  # 22,500 characters are 7.5 short documents


def test_the_cut_leaves_at_least_one_document_for_the_rest():
    assert OverlapSplit(share=1.0).cut(documents(10, 5_000)) == 9


def test_the_share_moves_toward_tokenization_over_tokenization_plus_device_time():
    split = OverlapSplit(weight=0.25)
    split.observe(tokenization_s=0.006, device_s=0.018)  # T / (T + D) = 0.25
    assert split.share == pytest.approx(DEFAULT_SHARE + 0.25 * (0.25 - DEFAULT_SHARE))
    for _ in range(60):
        split.observe(tokenization_s=0.006, device_s=0.018)
    assert split.share == pytest.approx(0.25)
    assert split.cut(documents(40, 1_000)) == 10


@pytest.mark.parametrize("tokenization_s, device_s, bound", [(0.001, 10.0, MIN_SHARE), (10.0, 0.001, MAX_SHARE)])
def test_the_share_stays_within_its_bounds(tokenization_s, device_s, bound):
    split = OverlapSplit(weight=1.0)
    split.observe(tokenization_s, device_s)
    assert split.share == bound


def test_a_request_without_times_teaches_nothing():
    split = OverlapSplit()
    split.observe(0.0, 0.02)
    split.observe(0.004, 0.0)
    assert split.share == DEFAULT_SHARE
