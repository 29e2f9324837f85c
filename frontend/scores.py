"""Turning model logits into the scores the scoring routes answer with, and ranking by them."""

from __future__ import annotations

import numpy as np


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x), computed without overflow for large |x|, as float32."""
    x = logits.astype(np.float64)
    out = np.empty_like(x)
    positive = x >= 0
    out[positive] = 1.0 / (1.0 + np.exp(-x[positive]))
    exp_x = np.exp(x[~positive])
    out[~positive] = exp_x / (1.0 + exp_x)
    return out.astype(np.float32)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, as float32."""
    x = logits.astype(np.float64)
    x = np.exp(x - x.max(axis=-1, keepdims=True))
    return (x / x.sum(axis=-1, keepdims=True)).astype(np.float32)


def ranking(scores: np.ndarray) -> list[int]:
    """Indices from the highest score to the lowest; equal scores keep their input order."""
    return np.argsort(-scores.astype(np.float64), kind="stable").tolist()
