"""Helpers for bulk-job tests: batch input files and waiting for a batch to end."""

from __future__ import annotations

import base64
import json
import shutil
import time
from pathlib import Path

import httpx
import numpy as np

FINAL = ("completed", "failed", "cancelled", "expired")


def embedding_lines(count: int, prefix: str = "r") -> list[str]:
    """Request lines for /v1/embeddings: mostly one text, every seventh a list of two."""
    lines = []
    for i in range(count):
        text = f"document {i}: the quick brown fox {i % 13} jumps over {i % 7} lazy dogs"
        body = {"input": [text, f"and a second text {i}"] if i % 7 == 0 else text,
                "model": "sentence-transformers/all-MiniLM-L6-v2"}
        lines.append(json.dumps({"custom_id": f"{prefix}{i}", "method": "POST", "url": "/v1/embeddings", "body": body}))
    return lines


def wait_final(client, batch_id: str, timeout: float = 240.0):
    end = time.monotonic() + timeout
    batch = client.batches.retrieve(batch_id)
    while batch.status not in FINAL:
        if time.monotonic() > end:
            raise AssertionError(f"batch still {batch.status} after {timeout} s: {batch.request_counts}")
        time.sleep(0.3)
        batch = client.batches.retrieve(batch_id)
    return batch


DISTINCT_TEXTS = 2000
WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")


def short_text(i: int) -> str:
    """The short text (about five tokens) of line or row i: DISTINCT_TEXTS of them, each used again every
    DISTINCT_TEXTS lines, so that a reference of every vector costs a tenth of a 20,000-line job."""
    k = i % DISTINCT_TEXTS
    return f"{WORDS[k % 8]} {k}"


def short_lines(count: int) -> list[str]:
    """/v1/embeddings request lines of short texts: most base64 (as the openai client asks), every fifth in
    floats, every eleventh with two inputs (its own text and the next line's)."""
    lines = []
    for i in range(count):
        body = {"input": [short_text(i), short_text(i + 1)] if i % 11 == 0 else short_text(i),
                "encoding_format": "float" if i % 5 == 0 else "base64"}
        lines.append(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/embeddings", "body": body}))
    return lines


def decoded_vectors(output: dict) -> list[np.ndarray]:
    """The vectors of one output line, whether written as floats or base64."""
    rows = []
    for item in output["response"]["body"]["data"]:
        value = item["embedding"]
        rows.append(np.frombuffer(base64.b64decode(value), dtype="<f4") if isinstance(value, str)
                    else np.asarray(value, dtype=np.float32))
    return rows


def reference_vectors(url: str, texts: list[str]) -> dict[str, np.ndarray]:
    """Each distinct text's vector from POST /v1/embeddings."""
    distinct = sorted(set(texts))
    found: dict[str, np.ndarray] = {}
    for start in range(0, len(distinct), 1000):
        part = distinct[start:start + 1000]
        answer = httpx.post(url + "/v1/embeddings", json={"input": part}, timeout=300)
        answer.raise_for_status()
        for text, item in zip(part, answer.json()["data"]):
            found[text] = np.asarray(item["embedding"], dtype=np.float32)
    return found


def check_job_output(url: str, outputs: list[dict], count: int) -> None:
    """Every custom_id of short_lines(count) once, in order, each vector equal to /v1/embeddings' (cosine)."""
    assert [o["custom_id"] for o in outputs] == [f"line-{i}" for i in range(count)]
    reference = reference_vectors(url, [short_text(i) for i in range(count + 1)])
    for i, output in enumerate(outputs):
        assert output["response"]["status_code"] == 200, output
        texts = [short_text(i), short_text(i + 1)] if i % 11 == 0 else [short_text(i)]
        got = decoded_vectors(output)
        assert len(got) == len(texts)
        for vector, text in zip(got, texts):
            want = reference[text]
            cosine = float(vector @ want / np.linalg.norm(vector) / np.linalg.norm(want))
            assert cosine >= 0.9999, (output["custom_id"], text, cosine)


SMALL_MODEL_DIM = 32


def small_minilm(root: Path) -> Path:
    """The packaged all-MiniLM-L6-v2's layout and tokenizer with two narrow layers of random weights (width
    SMALL_MODEL_DIM). The bulk-job tests check order, durability and resumption, not numerics; with the
    real six layers their 100,000 embeddings spend minutes in the model on a CPU."""
    import torch
    from transformers import BertConfig, BertModel

    from quiver.common.model_info import default_model_dir

    source, path = default_model_dir(), root / "small-minilm"
    shutil.copytree(source, path, ignore=lambda folder, names: {"model.safetensors", "config.json"} & set(names)
                    if Path(folder) == Path(source) else set())
    config = BertConfig.from_pretrained(source)
    config.update({"hidden_size": SMALL_MODEL_DIM, "intermediate_size": 2 * SMALL_MODEL_DIM, "num_hidden_layers": 2,
                   "num_attention_heads": 2})
    torch.manual_seed(0)
    BertModel(config, add_pooling_layer=False).save_pretrained(path)
    pooling = json.loads((path / "1_Pooling" / "config.json").read_text())
    pooling["word_embedding_dimension"] = SMALL_MODEL_DIM
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return path
