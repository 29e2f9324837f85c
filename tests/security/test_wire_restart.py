"""A broker killed with -9 under load and started again within the liveness window,
with the default heartbeat settings (1 s × 3), loses no request: every frontend sees the new broker's
instance id in its next heartbeat reply and sends again every chunk it waits for; the workers
register again when the new broker tells them to."""

from __future__ import annotations

import signal
import time

import pytest

from quiver.common.security import new_cluster_secret
from tests.cluster import Cluster
from tests.corpus import sentences
from tests.load import MixedLoad

pytestmark = pytest.mark.slow


def test_broker_kill_9_and_quick_restart_with_default_heartbeats_loses_nothing(st_model):
    texts = sentences(120)
    reference = st_model.encode(texts, normalize_embeddings=True)
    token_ids = [st_model.tokenizer(t, truncation=True, max_length=256)["input_ids"] for t in texts]
    cluster = Cluster(workers=2, heartbeat_interval_s=1.0, env={"QUIVER_CLUSTER_SECRET": new_cluster_secret()})
    with cluster:
        load = MixedLoad(cluster.url, texts, reference, token_ids, clients=3, timeout_s=60).start()
        time.sleep(5)
        cluster.broker.signal(signal.SIGKILL)
        cluster.broker.wait(5)
        cluster.start_broker()  # at once: well inside the frontend's 3 s liveness window
        cluster.wait_live_workers(2, timeout=60)
        time.sleep(5)
        report = load.finish()
        print("\n" + report.summary("kill -9 the broker and start it again at once, default heartbeats"))
        failures = report.failures()
        assert report.sent > 0
        assert not failures, [(f.kind, f.status, f.detail) for f in failures[:5]]
        assert "sending" in cluster.frontend.log() and "again" in cluster.frontend.log()
