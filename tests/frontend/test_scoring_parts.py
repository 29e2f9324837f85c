"""The frontend's scoring and embedding-option pieces in-process: templates, model facts, output
encodings, score activations and ranking, request shapes, and pair / prompt tokenization."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest

from quiver.common.model_info import QUANTIZER_TANH, default_model_dir, load_model_info
from quiver.frontend.errors import APIError
from quiver.frontend.quantize import encode_rows, formats_for, packed_sign_bits, tanh_int8
from quiver.frontend.routes_score import predict_inputs, score_pairs
from quiver.frontend.scores import ranking, sigmoid, softmax
from quiver.frontend.templates import QWEN3_RERANKER, with_instruction
from quiver.frontend.tokenization import TextTokenizer


def test_qwen3_reranker_prompt_is_the_model_cards():
    text = QWEN3_RERANKER.prefix + QWEN3_RERANKER.body("Find it", "q?", "doc.") + QWEN3_RERANKER.suffix
    assert text == (
        "<|im_start|>system\n"
        'Judge whether the Document meets the requirements based on the Query and the Instruct provided. '
        'Note that the answer can only be "yes" or "no".<|im_end|>\n'
        "<|im_start|>user\n"
        "<Instruct>: Find it\n<Query>: q?\n<Document>: doc.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert with_instruction("Instruct: {instruction}\nQuery:", "find {x}", "cats") == "Instruct: find {x}\nQuery:cats"


def _checkpoint(root: Path, config: dict, files: dict[str, object]) -> Path:
    root.mkdir()
    (root / "config.json").write_text(json.dumps(config))
    (root / "tokenizer.json").write_text((default_model_dir() / "tokenizer.json").read_text())
    for name, content in files.items():
        (root / name).parent.mkdir(exist_ok=True)
        (root / name).write_text(json.dumps(content))
    return root


QWEN3 = {"model_type": "qwen3", "architectures": ["Qwen3Model"], "hidden_size": 8, "vocab_size": 30522,
         "max_position_embeddings": 64}
POOLING = {"modules.json": [{"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"}]}


def test_model_facts_for_instructions_and_quantization(tmp_path: Path):
    qwen3_embedding = load_model_info(_checkpoint(tmp_path / "a", QWEN3, {}))
    assert qwen3_embedding.instruction_template == "Instruct: {instruction}\nQuery:"
    e5_style = load_model_info(_checkpoint(tmp_path / "b", {**QWEN3, "model_type": "qwen3"}, {
        **POOLING, "1_Pooling/config.json": {"pooling_mode_mean_tokens": True},
        "config_sentence_transformers.json": {"prompts": {"web": "Instruct: search the web\nQuery: "}},
    }))
    assert e5_style.instruction_template == "Instruct: {instruction}\nQuery: "
    pplx = load_model_info(_checkpoint(tmp_path / "c", {**QWEN3, "is_causal": False}, {
        "modules.json": [*POOLING["modules.json"], {"type": "st_quantize.FlexibleQuantizer", "path": ""}],
        "1_Pooling/config.json": {"pooling_mode_mean_tokens": True},
    }))
    assert pplx.quantizer == QUANTIZER_TANH and pplx.instruction_template is None
    minilm = load_model_info(default_model_dir())
    assert minilm.quantizer is None and minilm.instruction_template is None and minilm.uses_token_types


def test_int8_and_packed_bits():
    rows = np.array([[0.0, 0.5, -0.5, 9.0, -9.0, 1e-9, -1e-9, 0.2, 0.9]], dtype=np.float32)
    np.testing.assert_array_equal(tanh_int8(rows), [[0, 59, -59, 127, -127, 0, 0, 25, 91]])
    bits = [1, 1, 0, 1, 0, 1, 0, 1, 1]  # x >= 0
    expected = [int("".join(map(str, bits[:8])), 2), 0b1000_0000]
    np.testing.assert_array_equal(packed_sign_bits(rows, signed=False), [expected])
    np.testing.assert_array_equal(packed_sign_bits(rows, signed=True), [[expected[0] - 128, 0]])
    assert encode_rows(rows, "ubinary") == [expected]
    assert base64.b64decode(encode_rows(rows, "base64_binary")[0]) == bytes(expected)  # Perplexity's names
    assert base64.b64decode(encode_rows(rows, "base64_int8")[0]) == tanh_int8(rows)[0].tobytes()
    assert formats_for(QUANTIZER_TANH) == ("float", "base64", "int8", "binary", "ubinary",
                                           "base64_int8", "base64_binary")
    assert formats_for(None) == ("float", "base64")


def test_activations_and_ranking():
    np.testing.assert_allclose(sigmoid(np.array([-1000.0, 0.0, 1000.0, 2.0])), [0.0, 0.5, 1.0, 1 / (1 + np.exp(-2))],
                               rtol=1e-6)
    probabilities = softmax(np.array([[1000.0, 1000.0, 0.0]]))
    np.testing.assert_allclose(probabilities, [[0.5, 0.5, 0.0]], atol=1e-7)
    assert ranking(np.array([0.1, 0.9, 0.5, 0.9], dtype=np.float32)) == [1, 3, 2, 0]


def test_score_pairing_rules():
    assert score_pairs("q", "d") == ("q", ["d"])
    assert score_pairs(["q"], ["a", "b"]) == ("q", ["a", "b"])
    assert score_pairs(["q1", "q2"], ["a", "b"]) == (["q1", "q2"], ["a", "b"])
    for text_1, text_2 in ((["q1", "q2"], "a"), (["q1", "q2"], ["a", "b", "c"])):
        with pytest.raises(APIError) as caught:
            score_pairs(text_1, text_2)
        assert caught.value.reason == "invalid_request"


def test_predict_input_shapes():
    assert predict_inputs("a") == (["a"], False)
    assert predict_inputs(["a", "b"]) == ([("a", "b")], False)
    assert predict_inputs(["a", "b", "c"]) == (["a", "b", "c"], True)
    assert predict_inputs([["a", "b"], ["c"], "d"]) == ([("a", "b"), "c", "d"], True)
    with pytest.raises(APIError):
        predict_inputs([["a", "b", "c"]])


def test_pairs_get_segment_ids_and_prompts_truncate_the_body_only():
    tokenizer = TextTokenizer(load_model_info(default_model_dir()))  # 256 tokens
    pair = tokenizer.encode_sync([("a cat", "a dog")], truncate=False, direction="right", with_types=True)
    assert pair.input_ids.tolist() == [101, 1037, 4937, 102, 1037, 3899, 102]
    assert pair.token_type_ids.tolist() == [0, 0, 0, 0, 1, 1, 1]

    body = " ".join(f"w{i}" for i in range(200))
    head = tokenizer.plain.encode("head words", add_special_tokens=False).ids
    tail = tokenizer.plain.encode("tail", add_special_tokens=False).ids
    full = tokenizer.plain.encode(body).ids
    with pytest.raises(APIError) as caught:
        tokenizer.encode_prompts_sync("head words", [body], "tail", False, "right", "texts")
    assert caught.value.reason == "input_too_long"
    room = 256 - len(head) - len(tail)
    for direction, kept in (("right", full[:room]), ("left", full[-room:])):
        seqs = tokenizer.encode_prompts_sync("head words", [body], "tail", True, direction, "texts")
        assert seqs.input_ids.tolist() == head + kept + tail
