"""The correctness gate's verdicts on served results that match the reference and on ones that do not."""

from __future__ import annotations

import numpy as np
import pytest

from quiver.bench.gate import GateFailed, cosines, judge_embeddings, judge_scores


def unit_rows(rng: np.random.Generator, rows: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((rows, dim))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_bf16_sized_rounding_passes():
    rng = np.random.default_rng(0)
    reference = unit_rows(rng, 16, 1024)
    served = reference + rng.standard_normal(reference.shape) * 2e-3 / np.sqrt(1024)
    verdict = judge_embeddings("server", served, reference, [f"input {i}" for i in range(16)], 0.999)
    assert verdict["passed"] and verdict["min_cosine"] > 0.9999 and verdict["inputs"] == 16


def test_one_diverging_row_fails_and_is_named():
    rng = np.random.default_rng(1)
    reference = unit_rows(rng, 8, 384)
    served = reference.copy()
    served[5] = reference[5] + 0.06 * unit_rows(rng, 1, 384)[0]  # cosine about 0.998: 0.2 % divergence
    labels = [f"input {i}" for i in range(8)]
    assert cosines(served, reference)[5] < 0.999
    with pytest.raises(GateFailed, match="input 5") as failure:
        judge_embeddings("server", served, reference, labels, 0.999)
    assert "diverge" in str(failure.value) and "nothing was timed" in str(failure.value)
    assert failure.value.verdict["passed"] is False and failure.value.verdict["min_cosine"] < 0.999


def test_scale_does_not_matter_but_shape_and_nan_do():
    rng = np.random.default_rng(2)
    reference = unit_rows(rng, 4, 32)
    assert judge_embeddings("server", 3.0 * reference, reference, list("abcd"), 0.999)["passed"]
    with pytest.raises(GateFailed, match="shape"):
        judge_embeddings("server", reference[:, :16], reference, list("abcd"), 0.999)
    broken = reference.copy()
    broken[2] = np.nan
    with pytest.raises(GateFailed):
        judge_embeddings("server", broken, reference, list("abcd"), 0.999)


def test_scores_within_tolerance_pass_and_beyond_fail():
    reference = np.array([0.1, 0.5, 0.93])
    assert judge_scores("server", reference + 0.004, reference, 0.01)["passed"]
    with pytest.raises(GateFailed, match="document 1"):
        judge_scores("server", reference + np.array([0.0, 0.05, 0.0]), reference, 0.01)
    with pytest.raises(GateFailed):
        judge_scores("server", np.array([0.1, np.nan, 0.93]), reference, 0.01)
