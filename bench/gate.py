"""The correctness gate: before anything is timed, served results must match a float32 reference.

Embeddings pass when every served row has a cosine of at least min_cosine (0.999: 0.1 % divergence)
with the reference row of the same input; scores pass when no sigmoid score differs by more than
max_score_error. The reference runs each input alone, so no padding can blur the comparison.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from quiver.bench.inprocess import TransformersRunner
from quiver.bench.targets import HttpTarget


class GateFailed(RuntimeError):
    """The served results diverge from the reference; the message says where and by how much."""

    def __init__(self, message: str, verdict: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.verdict = {**(verdict or {}), "passed": False, "message": message}


@dataclass(frozen=True)
class GateInputs:
    texts: list[str]  # sent as text in one request (tokenization on the server)
    id_rows: list[np.ndarray]  # [1, length] token ids, one request each
    query: str = ""
    documents: tuple[str, ...] = ()


def cosines(served: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity of two [rows, dim] arrays."""
    served = np.asarray(served, dtype=np.float64)
    reference = np.asarray(reference, dtype=np.float64)
    if served.shape != reference.shape:
        raise GateFailed(f"served embeddings have shape {served.shape}, the reference {reference.shape}")
    norms = np.linalg.norm(served, axis=1) * np.linalg.norm(reference, axis=1)
    return np.sum(served * reference, axis=1) / np.maximum(norms, 1e-30)


def judge_embeddings(name: str, served: np.ndarray, reference: np.ndarray, labels: list[str],
                     min_cosine: float) -> dict[str, Any]:
    """The gate's verdict on embeddings as a report entry; raises GateFailed below min_cosine."""
    values = cosines(served, reference)
    worst = int(np.argmin(values))
    verdict = {
        "kind": "embeddings", "inputs": len(values), "min_cosine": round(float(values.min()), 6),
        "mean_cosine": round(float(values.mean()), 6), "worst_input": labels[worst], "threshold": min_cosine,
        "passed": bool(values.min() >= min_cosine),
    }
    if not np.all(np.isfinite(values)) or not verdict["passed"]:
        raise GateFailed(
            f"{name}: served embeddings diverge from the float32 reference: cosine {values[worst]:.6f} at "
            f"{labels[worst]} is below {min_cosine} (more than {100 * (1 - min_cosine):.2g} % divergence); "
            f"nothing was timed", verdict)
    return verdict


def judge_scores(name: str, served: np.ndarray, reference: np.ndarray, max_error: float) -> dict[str, Any]:
    errors = np.abs(np.asarray(served, dtype=np.float64) - np.asarray(reference, dtype=np.float64))
    worst = int(np.nanargmax(np.where(np.isnan(errors), np.inf, errors)))
    verdict = {"kind": "scores", "inputs": len(errors), "max_error": round(float(errors[worst]), 6),
               "threshold": max_error, "passed": bool(np.all(errors <= max_error))}
    if not verdict["passed"]:
        raise GateFailed(
            f"{name}: served scores diverge from the float32 reference: document {worst} scored "
            f"{served[worst]:.6f}, the reference {reference[worst]:.6f} (allowed difference {max_error}); "
            f"nothing was timed", verdict)
    return verdict


async def check_embeddings(target: HttpTarget, reference: TransformersRunner, inputs: GateInputs,
                           min_cosine: float) -> dict[str, Any]:
    served = [await target.embed(inputs.texts)]
    expected = [np.concatenate([reference.embed_texts([text]) for text in inputs.texts])]
    labels = [f"text {i} ({len(t)} chars)" for i, t in enumerate(inputs.texts)]
    for row in inputs.id_rows:
        served.append(await target.embed(row))
        expected.append(reference.embed_ids(row))
        labels.append(f"{row.shape[1]} token ids")
    return judge_embeddings(target.name, np.concatenate(served), np.concatenate(expected), labels, min_cosine)


async def check_scores(target: HttpTarget, reference: TransformersRunner, inputs: GateInputs,
                       max_error: float) -> dict[str, Any]:
    documents = list(inputs.documents)
    served = await target.score(inputs.query, documents)
    expected = np.concatenate([reference.score(inputs.query, [d]) for d in documents])
    return judge_scores(target.name, served, expected, max_error)
