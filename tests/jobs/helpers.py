"""Helpers for bulk-job tests: batch input files and waiting for a batch to end."""

from __future__ import annotations

import json
import time

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
