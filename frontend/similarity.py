"""vLLM's /score on an embedding model: the cosine similarity of the two sides' embeddings.

Both sides go through the ordinary embedding pipeline at once (normalised on the worker), so a score
is the dot product of two unit vectors. An instruction, for models that take one, goes before the
text_1 side only: it describes the query, as Qwen3-Embedding's card writes it.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np

from quiver.frontend.pipeline import Timings
from quiver.frontend.service import Scores, Service


async def cosine_scores(service: Service, queries: str | list[str], documents: list[str], *, route: str,
                        truncate: bool | None, instruction: str | None) -> Scores:
    """One cosine per pair: one query against every document, or queries[i] against documents[i]."""
    timings = Timings(started=time.monotonic())
    query_list = [queries] if isinstance(queries, str) else queries
    service.check_count(len(documents), "text_2")
    sides = [
        asyncio.ensure_future(service.embed(query_list, route=route, truncate=truncate, direction="right",
                                            prompt_name=None, normalize=True, dimensions=None, param="text_1",
                                            instruction=instruction)),
        asyncio.ensure_future(service.embed(documents, route=route, truncate=truncate, direction="right",
                                            prompt_name=None, normalize=True, dimensions=None, param="text_2")),
    ]
    try:
        left, right = await asyncio.gather(*sides)
    finally:
        for side in sides:
            side.cancel()  # the other side's chunks, when one side failed
    if len(query_list) == 1:
        values = right.rows @ left.rows[0]
    else:
        values = np.einsum("ij,ij->i", left.rows, right.rows)
    timings.tokenization_s = left.timings.tokenization_s + right.timings.tokenization_s
    timings.queue_s = max(left.timings.queue_s, right.timings.queue_s)
    timings.inference_s = max(left.timings.inference_s, right.timings.inference_s)
    return Scores(values.astype(np.float32), left.num_tokens + right.num_tokens, timings)
