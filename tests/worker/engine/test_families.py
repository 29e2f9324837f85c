"""Every model family on CPU in float32 against transformers' own classes, and ragged == one at a time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.worker.engine.families import FAMILIES, MAX_POSITIONS, VOCAB, Family, reference_rows, write_family
from quiver.worker.engine import Batch, load_engine

LENGTHS = [1, 7, 33, 64, 5, 100]


@pytest.fixture(scope="module", params=FAMILIES, ids=[f.name for f in FAMILIES])
def family_checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Family, Path, Any]:
    family: Family = request.param
    path, model = write_family(family, tmp_path_factory.mktemp("ckpt"))
    return family, path, model


def _inputs(seed: int) -> tuple[list[np.ndarray], list[np.ndarray], list[bool]]:
    rng = np.random.default_rng(seed)
    sequences = [rng.integers(4, VOCAB, size=n, dtype=np.int32) for n in LENGTHS]
    types = [(np.arange(n) >= n // 2).astype(np.int32) for n in LENGTHS]
    normalize = [bool(i % 2) for i in range(len(LENGTHS))]
    return sequences, types, normalize


def _batch(sequences: list[np.ndarray], types: list[np.ndarray], normalize: list[bool]) -> Batch:
    return Batch(
        input_ids=np.concatenate(sequences).astype(np.int32),
        seq_lens=np.array([len(s) for s in sequences], dtype=np.int32),
        token_type_ids=np.concatenate(types).astype(np.int32),
        normalize=np.array(normalize),
    )


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_matches_transformers(family_checkpoint: tuple[Family, Path, Any]) -> None:
    family, path, model = family_checkpoint
    assert max(LENGTHS) <= MAX_POSITIONS
    engine = load_engine(path)
    sequences, types, normalize = _inputs(seed=1)
    lazy = engine.step(_batch(sequences, types, normalize))
    rows = lazy.wait()
    lazy.release()
    expected = reference_rows(family, model, sequences, types, normalize)
    assert rows.shape == (len(LENGTHS), engine.info.output_dim) == expected.shape
    if family.pooling is None:
        np.testing.assert_allclose(rows, expected, atol=1e-4, rtol=0)
    else:
        assert _cosines(rows, expected).min() >= 0.99999
        np.testing.assert_allclose(rows, expected, atol=1e-4, rtol=1e-4)
        norms = np.linalg.norm(rows, axis=1)
        np.testing.assert_allclose(norms[1::2], 1.0, atol=1e-5)


def test_ragged_equals_one_at_a_time_and_bucket_padding(family_checkpoint: tuple[Family, Path, Any]) -> None:
    family, path, _ = family_checkpoint
    engine = load_engine(path)
    sequences, types, normalize = _inputs(seed=2)
    together = engine.step(_batch(sequences, types, normalize)).wait()
    alone = np.concatenate([engine.step(_batch([s], [t], [n])).wait() for s, t, n in zip(sequences, types, normalize)])
    np.testing.assert_allclose(together, alone, atol=2e-5, rtol=1e-5)
    # The padded layout a CUDA graph bucket uses (dummy padding row, empty rows) gives the same rows.
    padded = engine.run_eager(_batch(sequences, types, normalize), bucketed=True)
    np.testing.assert_allclose(padded, together, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["qwen3_causal_last", "bert_cls"])
def test_long_padding_stays_inside_the_position_table(name: str, tmp_path: Path) -> None:
    """Above 1024 tokens buckets grow by 256: the padding row is longer than this model's 128 positions."""
    family = next(f for f in FAMILIES if f.name == name)
    path, _ = write_family(family, tmp_path)
    engine = load_engine(path)
    rng = np.random.default_rng(5)
    sequences = [rng.integers(4, VOCAB, size=n, dtype=np.int32) for n in [120] * 8 + [70]]
    types = [np.zeros(len(s), dtype=np.int32) for s in sequences]
    batch = _batch(sequences, types, [True] * len(sequences))
    assert batch.num_tokens == 1030  # bucket 1280: 250 padding tokens
    np.testing.assert_allclose(engine.run_eager(batch, bucketed=True), engine.run_eager(batch), atol=2e-5, rtol=1e-5)
