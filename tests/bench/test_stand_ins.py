"""The GPU run's random-weight stand-ins, in narrow two-layer versions: loadable by every runner."""

from __future__ import annotations

import numpy as np
import pytest

from quiver.bench.corpus import TokenCorpus
from quiver.bench.gate import cosines
from quiver.bench.inprocess import SentenceTransformersRunner, TransformersRunner
from quiver.bench.stand_ins import build_stand_in
from quiver.common.model_info import load_model_info


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("stand-ins")


def test_pplx_embed_stand_in_is_a_bidirectional_mean_pooled_qwen3(root):
    info = load_model_info(build_stand_in("pplx-embed-0.6b-shape", root, "cpu", small=True))
    assert (info.model_type, info.kind, info.pooling, info.causal, info.normalize) == ("qwen3", "embedding", "mean",
                                                                                       False, True)
    corpus = TokenCorpus(info.tokenizer_path)
    assert corpus.num_special == 0 and len(set(corpus.ids.tolist())) > 1000, "real text, many distinct tokens"
    rows = corpus.id_batch(64, 3)
    assert rows.shape == (3, 64) and rows.max() < info.vocab_size
    texts = corpus.texts(48, 3)
    reference = TransformersRunner(info, "cpu", "float32")
    by_text, by_ids = reference.embed_texts(texts), reference.embed_ids(rows)
    sentence_transformers = SentenceTransformersRunner(info, "cpu", "float32").embed_texts(texts)
    assert by_ids.shape == (3, 64) and cosines(by_text, sentence_transformers).min() > 0.9999


def test_bge_m3_stand_in_wraps_texts_and_never_emits_the_padding_id(root):
    info = load_model_info(build_stand_in("bge-m3-shape", root, "cpu", small=True))
    assert (info.model_type, info.pooling, info.max_input_length) == ("xlm-roberta", "cls", 8192)
    corpus = TokenCorpus(info.tokenizer_path)
    assert (corpus.prefix, corpus.suffix) == ([0], [2])
    pad_id = info.config["pad_token_id"]
    assert pad_id == 1 and pad_id not in corpus.ids.tolist()
    texts = corpus.texts(40, 4)
    ids = [e.ids for e in corpus.tokenizer.encode_batch(texts)]
    assert all(len(seq) == 40 and pad_id not in seq for seq in ids)
    reference = TransformersRunner(info, "cpu", "float32")
    alone = np.concatenate([reference.embed_texts([t]) for t in texts])
    padded_batch = reference.embed_texts(texts + ["short"])[:4]
    assert cosines(alone, padded_batch).min() > 0.9999, "padding must not shift XLM-R's positions"


def test_reranker_stand_in_scores_pairs(root):
    info = load_model_info(build_stand_in("bge-reranker-v2-m3-shape", root, "cpu", small=True))
    assert (info.kind, info.num_labels) == ("classifier", 1)
    scores = TransformersRunner(info, "cpu", "float32").score("a question", ["one document", "another document here"])
    assert scores.shape == (2,) and ((scores > 0) & (scores < 1)).all()
