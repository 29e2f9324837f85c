"""The packaged all-MiniLM-L6-v2 against sentence-transformers' own encode()."""

from __future__ import annotations

import numpy as np

from quiver.common.model_info import default_model_dir
from quiver.worker.engine import Batch, load_engine

TEXTS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Quiver serves text embeddings and relevance scores from GPUs, fast.",
    "a",
    "Embeddings turn text into vectors; " * 12,
]


def test_minilm_matches_sentence_transformers() -> None:
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    path = default_model_dir()
    engine = load_engine(path)
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.no_padding()  # the packaged tokenizer.json pads to 128; the engine takes unpadded ids
    tokenizer.enable_truncation(engine.info.model.max_input_length)
    encoded = [tokenizer.encode(text).ids for text in TEXTS]
    batch = Batch(
        input_ids=np.concatenate(encoded).astype(np.int32),
        seq_lens=np.array([len(ids) for ids in encoded], dtype=np.int32),
        normalize=np.ones(len(TEXTS), dtype=bool),
    )
    lazy = engine.step(batch)
    rows = lazy.wait()
    lazy.release()

    expected = SentenceTransformer(str(path), device="cpu").encode(TEXTS)
    cosines = (rows * expected).sum(1) / (np.linalg.norm(rows, axis=1) * np.linalg.norm(expected, axis=1))
    assert cosines.min() >= 0.9999
    np.testing.assert_allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)


def test_a_cpu_engines_default_step_is_short() -> None:
    # A request that lands during a CPU step waits for all of it, and a CPU's step time grows with every
    # token (2,048 tokens of this model: about 2 s on two cores): the default budget stays at that, or at
    # one row of the model's longest input where that is longer.
    info = load_engine(default_model_dir()).info
    assert info.max_batch_tokens == max(2048, info.model.max_input_length)


def test_start_up_probes_stay_within_the_token_budget() -> None:
    # Start-up's fusion probe asked for 1,024 tokens whatever the budget: under --max-batch-tokens 1000 it
    # overflowed the input buffer and every fused set was dropped as failed.
    from quiver.worker.engine.choices import probe_batch

    engine = load_engine(default_model_dir(), max_batch_tokens=1000)
    probe = probe_batch(engine, 1024, 512)
    assert probe.num_tokens == 1000 and max(probe.seq_lens) <= engine.info.model.max_input_length
    assert engine.run_eager(probe).shape == (probe.num_seqs, engine.info.model.output_dim)
