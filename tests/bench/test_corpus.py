"""The benchmark corpus: real standard-library text, cut to exact token lengths with the model's tokenizer."""

from __future__ import annotations

import pytest

from quiver.bench.corpus import TokenCorpus, stdlib_documents
from quiver.common.model_info import default_model_dir


@pytest.fixture(scope="module")
def corpus() -> TokenCorpus:
    return TokenCorpus(default_model_dir() / "tokenizer.json")


def test_documents_are_real_prose_from_the_standard_library():
    documents = stdlib_documents()
    assert len(documents) > 1000
    assert any("Return" in doc for doc in documents)
    assert sum(map(len, documents)) > 500_000


def test_token_id_rows_have_exact_lengths_and_the_special_tokens(corpus):
    cls_id, sep_id = corpus.tokenizer.token_to_id("[CLS]"), corpus.tokenizer.token_to_id("[SEP]")
    for length in (8, 128, 512, 4096):
        rows = corpus.id_batch(length, 5)
        assert rows.shape == (5, length)
        assert (rows[:, 0] == cls_id).all() and (rows[:, -1] == sep_id).all()
        assert len({tuple(row) for row in rows.tolist()}) == 5, "each row is a different window of the text"
    words = corpus.tokenizer.decode(corpus.id_batch(64, 1)[0].tolist())
    assert sum(ch.isalpha() for ch in words) > 100


def test_texts_tokenize_to_the_requested_length(corpus):
    for length in (16, 128, 256, 512):
        texts = corpus.texts(length, 10)
        assert corpus.count_tokens(texts) == [length] * 10
        assert len(set(texts)) == 10


def test_bulk_corpus_has_ten_thousand_texts_of_mixed_lengths(corpus):
    texts = corpus.mixed_texts(10_000, 8, 256)
    counts = corpus.count_tokens(texts)
    assert len(texts) == 10_000
    assert min(counts) >= 8 and max(counts) <= 256
    assert len(set(counts)) > 200, "lengths spread over the whole range"
    assert sum(c < 32 for c in counts) > 1000 and sum(c > 128 for c in counts) > 1000
    assert len(set(texts)) > 9_500


def test_a_prompt_counts_towards_the_length():
    with_prompt = TokenCorpus(default_model_dir() / "tokenizer.json", prompt="query: ")
    text = with_prompt.text(40)
    assert with_prompt.count_tokens([text]) == [40]
    assert not text.startswith("query: ")
