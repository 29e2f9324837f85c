"""Scoring over HTTP by real processes against Hugging Face transformers, on checkpoints written here.

Three servers, one per scorer family: a MiniLM cross-encoder (BERT with one label: the real
all-MiniLM-L6-v2 encoder and tokenizer under a random head, the shape of ms-marco MiniLM), a tiny
XLM-RoBERTa classifier with three labels, and a tiny Qwen3-Reranker (a causal LM scored from its
"yes" / "no" logits with the model card's prompt). Every score is checked against transformers'
own model on the same pairs, in float32, within 1e-4.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from quiver.common.model_info import default_model_dir
from quiver.frontend.overlap import MAX_SHARE, MIN_SHARE, OverlapSplit
from tests.cluster import Cluster, free_port
from tests.e2e.test_reliability import metric
from tests.worker.engine.families import spread_weights

ATOL = 1e-4
QUERY = "how do cats sleep"
DOCUMENTS = [
    "cats sleep for most of the day, often in warm places",
    "the stock market closed higher on friday",
    "a kitten curls up and sleeps next to its mother",
    "recipes for a quick vegetable soup",
    "dogs and cats both need a quiet place to rest",
    "",
    "sleep",
    "the history of the roman empire in three volumes",
]

# Qwen3-Reranker's prompt as its model card gives it, written out here independently of the server.
RERANKER_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n'
)
RERANKER_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
WEB_SEARCH = "Given a web search query, retrieve relevant passages that answer the query"


def reranker_body(instruction: str, query: str, document: str) -> str:
    return f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"


# ---- checkpoints ------------------------------------------------------------------------------------


def write_word_tokenizer(path: Path, texts: list[str], specials: list[str], added: list[str],
                         post_processor: Any = None) -> int:
    """A whitespace word-level tokenizer.json knowing every word of `texts`; returns its size."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {token: i for i, token in enumerate(specials)}
    for text in texts:
        for piece, _ in pre_tokenizers.Whitespace().pre_tokenize_str(text):
            words.setdefault(piece, len(words))
    tokenizer = Tokenizer(models.WordLevel(words, unk_token=specials[0]))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    if post_processor is not None:
        tokenizer.post_processor = post_processor
    tokenizer.add_tokens(added)
    tokenizer.save(str(path / "tokenizer.json"))
    return tokenizer.get_vocab_size()


def minilm_cross_encoder(root: Path) -> Path:
    """all-MiniLM-L6-v2's encoder and tokenizer under a random one-label head (ms-marco MiniLM's shape)."""
    from transformers import BertForSequenceClassification

    source = default_model_dir()
    torch.manual_seed(1)
    model = BertForSequenceClassification.from_pretrained(str(source), num_labels=1).eval()
    with torch.no_grad():
        model.classifier.weight.normal_(0.0, 0.5)
    path = root / "minilm-cross-encoder"
    model.save_pretrained(str(path), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        shutil.copy(source / name, path / name)
    return path


def xlmr_classifier(root: Path) -> Path:
    """A tiny XLMRobertaForSequenceClassification with three labels and "<s> a </s></s> b </s>" pairs."""
    from tokenizers import processors
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification

    path = root / "xlmr-classifier"
    path.mkdir()
    size = write_word_tokenizer(path, DOCUMENTS + [QUERY], ["<unk>", "<pad>", "<s>", "</s>"], [],
                                processors.RobertaProcessing(("</s>", 3), ("<s>", 2)))
    config = XLMRobertaConfig(
        vocab_size=size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=66, pad_token_id=1, bos_token_id=2, eos_token_id=3, type_vocab_size=1,
        num_labels=3, id2label={0: "negative", 1: "neutral", 2: "positive"},
        label2id={"negative": 0, "neutral": 1, "positive": 2},
    )
    spread_weights(XLMRobertaForSequenceClassification(config)).save_pretrained(str(path), safe_serialization=True)
    return path


def qwen3_reranker(root: Path) -> Path:
    """A tiny Qwen3ForCausalLM whose tokenizer knows the words of the reranker prompt and the test texts."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = root / "qwen3-reranker"
    path.mkdir()
    texts = [RERANKER_PREFIX, RERANKER_SUFFIX, reranker_body(WEB_SEARCH, QUERY, ""), *DOCUMENTS,
             "find recipes with vegetables"]
    size = write_word_tokenizer(path, texts, ["<unk>", "yes", "no"],
                                ["<|im_start|>", "<|im_end|>", "<think>", "</think>"])
    config = Qwen3Config(
        vocab_size=size, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=96, rope_theta=10000.0, rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    )
    spread_weights(Qwen3ForCausalLM(config)).save_pretrained(str(path), safe_serialization=True)
    return path


# ---- references ---------------------------------------------------------------------------------------


@functools.cache
def hf_tokenizer(path: Path) -> Any:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))
    vocab = tokenizer.get_vocab()
    tokenizer.pad_token = next((t for t in ("[PAD]", "<pad>") if t in vocab), "<unk>")
    return tokenizer


@functools.cache
def hf_model(path: Path, class_name: str) -> Any:
    import transformers

    return getattr(transformers, class_name).from_pretrained(str(path)).eval()


def hf_pair_logits(path: Path, queries: list[str], documents: list[str] | None, max_length: int) -> np.ndarray:
    """transformers' classification logits per (query, document) pair in its pair template (None: texts alone).

    Tokenized in one padded batch, as sentence-transformers' CrossEncoder does (an empty document
    stays a pair).
    """
    model = hf_model(path, "AutoModelForSequenceClassification")
    enc = hf_tokenizer(path)(queries, documents, truncation=True, max_length=max_length, padding=True,
                             return_tensors="pt", return_token_type_ids=True)
    types = enc["token_type_ids"] if model.config.model_type == "bert" else None
    with torch.no_grad():
        return model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"],
                     token_type_ids=types).logits.float().numpy()


def hf_reranker_logits(path: Path, instruction: str, query: str, documents: list[str]) -> np.ndarray:
    """logit("yes") - logit("no") after the model card's prompt, from transformers' causal LM."""
    model = hf_model(path, "Qwen3ForCausalLM")
    tokenizer = hf_tokenizer(path)
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    head = tokenizer(RERANKER_PREFIX, add_special_tokens=False)["input_ids"]
    tail = tokenizer(RERANKER_SUFFIX, add_special_tokens=False)["input_ids"]
    out = []
    with torch.no_grad():
        for document in documents:
            body = tokenizer(reranker_body(instruction, query, document))["input_ids"]
            last = model(input_ids=torch.tensor([head + body + tail])).logits[0, -1]
            log_probs = torch.log_softmax(torch.stack([last[no], last[yes]]), dim=0)
            assert abs(float(log_probs[1].exp()) - float(torch.sigmoid(last[yes] - last[no]))) < 1e-6
            out.append(float(last[yes] - last[no]))
    return np.array(out, dtype=np.float32)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


# ---- servers ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("scorers")
    return {"minilm": minilm_cross_encoder(root), "xlmr": xlmr_classifier(root), "qwen3": qwen3_reranker(root)}


@pytest.fixture(scope="module")
def cross_encoder(checkpoints):
    """Two workers and small chunks, so that one request's pairs spread over both."""
    metrics_port = free_port()
    cluster = Cluster(workers=2, model=str(checkpoints["minilm"]), broker_args=["--metrics-port", str(metrics_port)],
                      frontend_args=["--max-chunk-seqs", "4"])
    cluster.broker_metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    cluster.path = checkpoints["minilm"]
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def classifier(checkpoints):
    cluster = Cluster(workers=1, model=str(checkpoints["xlmr"]))
    cluster.path = checkpoints["xlmr"]
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def reranker(checkpoints):
    cluster = Cluster(workers=1, model=str(checkpoints["qwen3"]))
    cluster.path = checkpoints["qwen3"]
    cluster.start()
    yield cluster
    cluster.stop()


def post(cluster: Cluster, path: str, body: dict) -> httpx.Response:
    return httpx.post(cluster.url + path, json=body, timeout=60)


def ok(response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return response.json()


# ---- cross-encoder --------------------------------------------------------------------------------------


def test_cross_encoder_scores_equal_transformers(cross_encoder):
    logits = hf_pair_logits(cross_encoder.path, [QUERY] * len(DOCUMENTS), DOCUMENTS, 512)[:, 0]
    ranks = ok(post(cross_encoder, "/rerank", {"query": QUERY, "texts": DOCUMENTS}))
    assert sorted(r["index"] for r in ranks) == list(range(len(DOCUMENTS)))
    served = np.array([r["score"] for r in sorted(ranks, key=lambda r: r["index"])])
    np.testing.assert_allclose(served, sigmoid(logits), atol=ATOL, rtol=0)
    raw = ok(post(cross_encoder, "/rerank", {"query": QUERY, "texts": DOCUMENTS, "raw_scores": True}))
    np.testing.assert_allclose([r["score"] for r in sorted(raw, key=lambda r: r["index"])], logits, atol=ATOL, rtol=0)
    assert [r["index"] for r in raw] == [r["index"] for r in ranks]


def test_rerank_is_sorted_and_returns_text_on_request(cross_encoder):
    ranks = ok(post(cross_encoder, "/rerank", {"query": QUERY, "texts": DOCUMENTS, "return_text": True}))
    scores = [r["score"] for r in ranks]
    assert scores == sorted(scores, reverse=True)
    assert all(r["text"] == DOCUMENTS[r["index"]] for r in ranks)
    plain = ok(post(cross_encoder, "/rerank", {"query": QUERY, "texts": DOCUMENTS}))
    assert all(set(r) == {"index", "score"} for r in plain)


def test_cohere_rerank_top_n_and_documents(cross_encoder):
    full = ok(post(cross_encoder, "/rerank", {"query": QUERY, "texts": DOCUMENTS}))
    documents = [text if i % 2 else {"text": text, "title": "ignored"} for i, text in enumerate(DOCUMENTS)]
    body = ok(post(cross_encoder, "/v1/rerank", {"model": cross_encoder.path.name, "query": QUERY,
                                                "documents": documents, "top_n": 3, "return_documents": True}))
    assert body["model"] == cross_encoder.path.name and body["id"]
    assert [r["index"] for r in body["results"]] == [r["index"] for r in full[:3]]
    for result, expected in zip(body["results"], full):
        assert abs(result["relevance_score"] - expected["score"]) < 1e-6
        assert result["document"] == {"text": DOCUMENTS[result["index"]]}
    assert body["usage"]["total_tokens"] > len(DOCUMENTS) * 3
    everything = ok(post(cross_encoder, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS}))
    assert len(everything["results"]) == len(DOCUMENTS)
    assert all(set(r) == {"index", "relevance_score"} for r in everything["results"])
    more_than_all = ok(post(cross_encoder, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS, "top_n": 50}))
    assert len(more_than_all["results"]) == len(DOCUMENTS)


def test_vllm_score_one_to_one_one_to_many_and_many_to_many(cross_encoder):
    queries = ["where do cats sleep", "soup recipes", "roman history"]
    documents = DOCUMENTS[:3]
    pairwise = hf_pair_logits(cross_encoder.path, queries, documents, 512)[:, 0]
    one_to_many = hf_pair_logits(cross_encoder.path, [QUERY] * 3, documents, 512)[:, 0]

    body = ok(post(cross_encoder, "/score", {"text_1": queries, "text_2": documents}))
    assert body["object"] == "list" and body["id"].startswith("score-") and isinstance(body["created"], int)
    assert [d["index"] for d in body["data"]] == [0, 1, 2] and all(d["object"] == "score" for d in body["data"])
    np.testing.assert_allclose([d["score"] for d in body["data"]], sigmoid(pairwise), atol=ATOL, rtol=0)
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] > 0

    for text_1 in (QUERY, [QUERY]):
        body = ok(post(cross_encoder, "/score", {"text_1": text_1, "text_2": documents}))
        np.testing.assert_allclose([d["score"] for d in body["data"]], sigmoid(one_to_many), atol=ATOL, rtol=0)
    single = ok(post(cross_encoder, "/score", {"text_1": queries[1], "text_2": documents[1], "raw_scores": True}))
    assert len(single["data"]) == 1 and abs(single["data"][0]["score"] - pairwise[1]) < ATOL


def test_truncation_of_pairs(cross_encoder):
    long_document = "cats sleep in the sun " * 150  # 750 words, over MiniLM's 512 positions
    refused = post(cross_encoder, "/rerank", {"query": QUERY, "texts": [long_document]})
    assert refused.status_code == 422 and "512" in refused.json()["error"]
    served = ok(post(cross_encoder, "/rerank", {"query": QUERY, "texts": [long_document], "truncate": True,
                                               "raw_scores": True}))
    expected = hf_pair_logits(cross_encoder.path, [QUERY], [long_document], 512)[0, 0]
    assert abs(served[0]["score"] - expected) < ATOL
    left = ok(post(cross_encoder, "/rerank", {"query": QUERY, "texts": [long_document + " the end"],
                                             "truncate": True, "truncation_direction": "left"}))
    assert 0.0 <= left[0]["score"] <= 1.0


def test_one_label_head_predicts_with_sigmoid(cross_encoder):
    logits = hf_pair_logits(cross_encoder.path, [QUERY], [DOCUMENTS[0]], 512)[0]
    single = ok(post(cross_encoder, "/predict", {"inputs": [QUERY, DOCUMENTS[0]]}))
    assert single[0]["label"] == "LABEL_0"
    assert abs(single[0]["score"] - sigmoid(logits)[0]) < ATOL


def _dispatches_by_worker(cluster: Cluster) -> dict[str, float]:
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(cluster.broker_metrics_url, timeout=5).text):
        if family.name == "quiver_broker_dispatches":
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    counts[sample.labels["worker"]] = sample.value
    return counts


def test_pairs_are_chunked_over_both_workers(cross_encoder):
    texts = [f"{DOCUMENTS[i % len(DOCUMENTS)]} number {i}" for i in range(40)]
    before = _dispatches_by_worker(cross_encoder)
    ranks = ok(post(cross_encoder, "/rerank", {"query": QUERY, "texts": texts, "raw_scores": True}))
    after = _dispatches_by_worker(cross_encoder)
    assert sum(after.values()) - sum(before.values()) >= 10  # 40 pairs in chunks of at most 4
    assert {name for name, count in after.items() if count > before.get(name, 0.0)} == {"cpu-0", "cpu-1"}
    expected = hf_pair_logits(cross_encoder.path, [QUERY] * 40, texts, 512)[:, 0]
    served = np.array([r["score"] for r in sorted(ranks, key=lambda r: r["index"])])
    np.testing.assert_allclose(served, expected, atol=ATOL, rtol=0)


def long_documents(count: int, words: int) -> list[str]:
    """`count` distinct documents of about `words` words each, from DOCUMENTS' words."""
    vocabulary = " ".join(DOCUMENTS).split()
    return [" ".join(vocabulary[(i * 7 + j) % len(vocabulary)] for j in range(words)) for i in range(count)]


def _first_share(cluster: Cluster) -> float:
    """The frontend's learned share of a long scoring request sent before the rest tokenize (one model)."""
    return metric(cluster.url + "/metrics", "quiver_frontend_score_first_share")


def test_a_long_rerank_sends_its_first_documents_while_the_rest_tokenize(cross_encoder):
    """24 documents of ~1,000 characters: the first ones go out before the others are tokenized, as many as
    the learned share says (frontend/overlap.py); the scores are the same as transformers' and in input
    order, and the request's times move the learned share, which stays within its bounds."""
    texts = long_documents(24, 180)
    share = _first_share(cross_encoder)
    cut = OverlapSplit(share).cut(texts)
    assert sum(map(len, texts)) >= 16_384 and 1 <= cut < 24
    before = _dispatches_by_worker(cross_encoder)
    ranks = ok(post(cross_encoder, "/rerank", {"query": QUERY, "texts": texts, "raw_scores": True}))
    # Chunks of at most 4 pairs, the first part's and the rest's apart.
    chunks = -(-cut // 4) + -(-(24 - cut) // 4)
    assert sum(_dispatches_by_worker(cross_encoder).values()) - sum(before.values()) == chunks
    expected = hf_pair_logits(cross_encoder.path, [QUERY] * len(texts), texts, 512)[:, 0]
    served = np.array([r["score"] for r in sorted(ranks, key=lambda r: r["index"])])
    np.testing.assert_allclose(served, expected, atol=ATOL, rtol=0)
    learned = _first_share(cross_encoder)
    assert MIN_SHARE <= learned <= MAX_SHARE
    # The request's times moved the share, unless it sat at a bound its times would also clamp to.
    assert learned != share or share in (MIN_SHARE, MAX_SHARE)


@pytest.mark.parametrize("too_long", [1, 20])  # in the first part sent, and in the part tokenized after it
def test_a_too_long_document_of_a_long_rerank_is_named_by_its_index(cross_encoder, too_long):
    texts = long_documents(24, 180)
    texts[too_long] = "cats sleep in the sun " * 150  # 750 words, over MiniLM's 512 positions
    refused = post(cross_encoder, "/rerank", {"query": QUERY, "texts": texts})
    assert refused.status_code == 422, refused.text
    assert f"input {too_long} has" in refused.json()["error"]
    served = ok(post(cross_encoder, "/rerank", {"query": QUERY, "texts": texts, "truncate": True}))
    assert sorted(r["index"] for r in served) == list(range(len(texts)))


SCORER_ERRORS = [
    # (route, body, status, TEI error_type or OpenAI code, words the message must hold)
    ("/rerank", {"query": QUERY, "texts": []}, 400, "Empty", "empty"),
    ("/rerank", {"query": "", "texts": ["x"]}, 400, "Empty", "empty"),
    ("/rerank", {"query": QUERY}, 422, "Validation", "texts"),
    ("/rerank", {"query": QUERY, "texts": "one text"}, 422, "Validation", "texts"),
    ("/rerank", {"query": QUERY, "texts": ["x"], "truncation_direction": "up"}, 422, "Validation",
     "truncation_direction"),
    ("/rerank", {"query": QUERY, "texts": ["x"] * 2049}, 413, "Validation", "2048"),
    ("/rerank", {"query": QUERY, "texts": ["x"], "instruction": "judge"}, 400, "Validation", "instruction"),
    ("/v1/rerank", {"query": QUERY, "documents": ["x"], "top_n": -1}, 400, "invalid_request", "top_n"),
    ("/v1/rerank", {"query": QUERY, "documents": [{"title": "no text"}]}, 400, "invalid_request", "documents"),
    ("/v1/rerank", {"query": QUERY, "documents": []}, 400, "empty_input", "empty"),
    ("/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, 400, "invalid_request", "1:N"),
    ("/score", {"text_1": ["a", "b"], "text_2": "c"}, 400, "invalid_request", "1:N"),
    ("/score", {"text_1": [], "text_2": ["c"]}, 400, "empty_input", "text_1"),
    ("/score", {"text_1": "a", "text_2": []}, 400, "empty_input", "text_2"),
    ("/score", {"text_1": "a"}, 400, "invalid_request", "text_2"),
    ("/predict", {"inputs": [["a", "b", "c"]]}, 422, "Validation", "pair"),
    ("/predict", {"inputs": []}, 400, "Empty", "empty"),
    ("/v1/embeddings", {"input": "x"}, 400, "wrong_model_kind", "classifier model with 1 label"),
    ("/embed", {"inputs": "x"}, 424, "Backend", "needs an embedding model"),  # TEI's 424
]


@pytest.mark.parametrize("route,body,status,code,words", SCORER_ERRORS)
def test_scorer_errors(cross_encoder, route, body, status, code, words):
    response = post(cross_encoder, route, body)
    assert response.status_code == status, response.text
    if route.startswith("/v1/") or route == "/score":
        error = response.json()["error"]
        assert error["code"] == code
        message = error["message"]
    else:
        assert response.json()["error_type"] == code
        message = response.json()["error"]
    assert words.lower() in message.lower(), message


# ---- classifier with three labels ------------------------------------------------------------------------


def test_predict_labels_equal_transformers(classifier):
    texts = [DOCUMENTS[0], DOCUMENTS[1], DOCUMENTS[2]]
    pairs = [[QUERY, DOCUMENTS[0]], [QUERY, DOCUMENTS[3]]]
    singles = hf_pair_logits(classifier.path, texts, None, 64)
    paired = hf_pair_logits(classifier.path, [p[0] for p in pairs], [p[1] for p in pairs], 64)
    labels = ["negative", "neutral", "positive"]

    def check(predictions: list[dict], logits: np.ndarray, raw: bool) -> None:
        expected = logits if raw else np.exp(logits) / np.exp(logits).sum()
        assert [p["score"] for p in predictions] == sorted((p["score"] for p in predictions), reverse=True)
        by_label = {p["label"]: p["score"] for p in predictions}
        np.testing.assert_allclose([by_label[name] for name in labels], expected, atol=ATOL, rtol=0)

    batch = ok(post(classifier, "/predict", {"inputs": texts}))
    assert len(batch) == 3
    for predictions, logits in zip(batch, singles):
        check(predictions, logits, raw=False)
    check(ok(post(classifier, "/predict", {"inputs": texts[0]})), singles[0], raw=False)
    check(ok(post(classifier, "/predict", {"inputs": pairs[0], "raw_scores": True})), paired[0], raw=True)
    mixed = ok(post(classifier, "/predict", {"inputs": [pairs[0], [texts[1]], pairs[1]]}))
    for predictions, logits in zip(mixed, [paired[0], singles[1], paired[1]]):
        check(predictions, logits, raw=False)
    info = ok(httpx.get(classifier.url + "/info", timeout=10))
    assert info["model_kind"] == "classifier" and info["labels"] == {"0": "negative", "1": "neutral", "2": "positive"}


def test_classifier_with_three_labels_does_not_rank(classifier):
    # TEI answers a route its model cannot serve with 424, the OpenAI-style routes with 400.
    for route, body, status in (("/rerank", {"query": QUERY, "texts": ["x"]}, 424),
                                ("/score", {"text_1": "a", "text_2": "b"}, 400),
                                ("/v1/rerank", {"query": QUERY, "documents": ["x"]}, 400)):
        response = post(classifier, route, body)
        assert response.status_code == status, response.text
        assert "classifier model with 3 labels" in response.text


# ---- Qwen3-Reranker ----------------------------------------------------------------------------------------


def test_reranker_scores_equal_the_yes_probability_of_transformers(reranker):
    logits = hf_reranker_logits(reranker.path, WEB_SEARCH, QUERY, DOCUMENTS)
    ranks = ok(post(reranker, "/rerank", {"query": QUERY, "texts": DOCUMENTS}))
    served = np.array([r["score"] for r in sorted(ranks, key=lambda r: r["index"])])
    np.testing.assert_allclose(served, sigmoid(logits), atol=ATOL, rtol=0)
    assert [r["score"] for r in ranks] == sorted(served.tolist(), reverse=True)
    raw = ok(post(reranker, "/score", {"text_1": QUERY, "text_2": DOCUMENTS, "raw_scores": True}))
    np.testing.assert_allclose([d["score"] for d in raw["data"]], logits, atol=ATOL, rtol=0)


def test_a_long_reranker_request_sent_in_two_parts_equals_transformers(reranker):
    texts = [f"{DOCUMENTS[i % 8]} {DOCUMENTS[(i + 3) % 8]} {i}" for i in range(250)]
    assert OverlapSplit().cut(texts) > 0
    logits = hf_reranker_logits(reranker.path, WEB_SEARCH, QUERY, texts)
    raw = ok(post(reranker, "/score", {"text_1": QUERY, "text_2": texts, "raw_scores": True}))
    np.testing.assert_allclose([d["score"] for d in raw["data"]], logits, atol=ATOL, rtol=0)


def test_reranker_instruction(reranker):
    instruction = "find recipes with vegetables"
    logits = hf_reranker_logits(reranker.path, instruction, QUERY, DOCUMENTS[:4])
    body = ok(post(reranker, "/v1/rerank", {"query": QUERY, "documents": DOCUMENTS[:4], "instruction": instruction}))
    served = {r["index"]: r["relevance_score"] for r in body["results"]}
    np.testing.assert_allclose([served[i] for i in range(4)], sigmoid(logits), atol=ATOL, rtol=0)


def test_reranker_refuses_what_it_cannot_do(reranker):
    for route, body, status, words in (("/predict", {"inputs": "x"}, 424, "needs a classifier model"),
                                       ("/v1/embeddings", {"input": "x"}, 400, "a reranker model")):
        response = post(reranker, route, body)
        assert response.status_code == status and words in response.text, response.text
    too_long = post(reranker, "/rerank", {"query": QUERY, "texts": [" ".join(DOCUMENTS * 3)]})
    assert too_long.status_code == 422
    cut = ok(post(reranker, "/rerank", {"query": QUERY, "texts": [" ".join(DOCUMENTS * 3)], "truncate": True}))
    assert 0.0 < cut[0]["score"] < 1.0


def test_openapi_lists_the_scoring_routes(reranker):
    document = ok(httpx.get(reranker.url + "/openapi.json", timeout=10))
    for path in ("/rerank", "/v1/rerank", "/score", "/predict"):
        assert "post" in document["paths"][path]
