"""Steps queued behind the running one (worker/scheduler.py), in real processes: a worker whose steps
take the device 300 ms (QUIVER_INJECT_FAULTS step_ms: asynchronous steps on a CPU) gets a request cut
into four chunks of 16 texts, each a step no later arrival could join (the sequence cap of 16), so each
is launched behind the one before; every row still matches sentence-transformers."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from tests.cluster import Cluster, free_port
from tests.corpus import sentences
from tests.e2e.test_reliability import metric

STEP_MS = 300


@pytest.mark.parametrize("link_thread", ["off", "on"], ids=["inline-link", "threaded-link"])
def test_a_request_of_four_closed_steps_runs_them_back_to_back(st_model, link_thread: str) -> None:
    texts = sentences(64)
    reference = st_model.encode(texts, normalize_embeddings=True)
    port = free_port()
    with Cluster(workers=1, env={"QUIVER_INJECT_FAULTS": f"step_ms={STEP_MS}"},
                 worker_args=["--metrics-port", str(port), "--max-batch-seqs", "16", "--link-thread", link_thread],
                 frontend_args=["--max-chunk-seqs", "16", "--warmup-rounds", "0"]) as cluster:  # busy: 4 steps
        answer = httpx.post(cluster.url + "/v1/embeddings", json={"input": texts}, timeout=60)
        assert answer.status_code == 200, answer.text
        rows = np.array([item["embedding"] for item in answer.json()["data"]], dtype=np.float32)
        metrics_url = f"http://127.0.0.1:{port}/metrics"
        queued = metric(metrics_url, "quiver_worker_queued_steps_total")
        busy = metric(metrics_url, "quiver_worker_busy_seconds_total")
    assert rows.shape == reference.shape
    assert float(((rows * reference).sum(1)).min()) > 0.9999
    # the first chunk's step starts the device; at least two of the other three are queued behind a step
    # (the broker may hand the worker the last chunk only once the first is answered)
    assert queued >= 2
    assert busy == pytest.approx(4 * STEP_MS / 1000, rel=0.2)
