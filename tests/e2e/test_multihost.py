"""Past one host: groups of workers on other "hosts" join one broker over CurveZMQ, each group with its
own key pair; losing a whole group under load loses no request.

On loopback, each "host" is a group of worker processes that share one key pair made with
`quiver keys`, as the workers of one machine would. The broker binds its worker endpoint on every
interface (what a broker serving other hosts does, allowed only with CurveZMQ) and admits the
groups' public keys; the frontend has its own key pair. Every answer is checked against
sentence-transformers.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cluster import Cluster, Process, free_port
from tests.corpus import sentences
from tests.e2e.test_reliability import metric
from tests.load import MixedLoad

pytestmark = pytest.mark.slow

GROUPS = {"host-a": 2, "host-b": 1, "host-c": 1}  # "host" → its workers; host-a is the one killed


def quiver_keys(directory: Path, name: str) -> tuple[Path, Path]:
    """A key pair made the way an operator makes one: `quiver keys`."""
    subprocess.run([sys.executable, "-m", "quiver", "keys", "--dir", str(directory), "--name", name],
                   check=True, capture_output=True, timeout=60)
    return directory / f"{name}.key", directory / f"{name}.key_secret"


@dataclass
class CurveLayout:
    """Every key file of the layout: the broker's pair, the frontend's, and one pair per worker group."""

    root: Path

    def broker_args(self) -> list[str]:
        """The broker's key options: each role's admitted public keys in a directory of their own."""
        return ["--curve-secret-key", str(self.root / "broker.key_secret"),
                "--curve-frontend-keys-dir", str(self.root / "authorized-frontends"),
                "--curve-worker-keys-dir", str(self.root / "authorized-workers")]

    def client_args(self, name: str) -> list[str]:
        """Options of a frontend or worker holding the key pair `name`."""
        return ["--curve-secret-key", str(self.root / name / f"{name}.key_secret"),
                "--curve-broker-key", str(self.root / "broker.key")]


@pytest.fixture
def curve_layout(tmp_path: Path) -> CurveLayout:
    """`quiver keys` for the broker, the frontend and each group; each public key a peer's admission."""
    layout = CurveLayout(tmp_path / "keys")
    quiver_keys(layout.root, "broker")
    admitted = {"frontends": layout.root / "authorized-frontends", "workers": layout.root / "authorized-workers"}
    for role, names in (("frontends", ["frontend"]), ("workers", list(GROUPS))):
        admitted[role].mkdir(parents=True)
        for name in names:
            public, _ = quiver_keys(layout.root / name, name)  # each "host" keeps its own secret
            shutil.copy(public, admitted[role] / public.name)
    return layout


@pytest.fixture(scope="module")
def workload(st_model):
    texts = sentences(160)
    reference = st_model.encode(texts, normalize_embeddings=True)
    token_ids = [st_model.tokenizer(t, truncation=True, max_length=256)["input_ids"] for t in texts]
    return texts, reference, token_ids


def inflight_on(metrics_url: str, workers: list[str]) -> float:
    return sum(metric(metrics_url, "quiver_broker_inflight_chunks", {"worker": name}) for name in workers)


def test_a_whole_worker_group_killed_under_load_loses_nothing(curve_layout, workload):
    metrics_port = free_port()
    metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    cluster = Cluster(workers=0, heartbeat_interval_s=1.0, frontend_args=[
        *curve_layout.client_args("frontend"), "--max-chunk-seqs", "4"])  # small chunks: each request spans hosts
    port = cluster.worker_endpoint.rsplit(":", 1)[1]
    cluster.broker_args = [*curve_layout.broker_args(), "--worker-endpoint", f"tcp://0.0.0.0:{port}",
                           "--metrics-port", str(metrics_port)]
    groups: dict[str, list[Process]] = {}
    with cluster:
        for group, count in GROUPS.items():
            groups[group] = [cluster.start_worker(extra=[*curve_layout.client_args(group), "--name", f"{group}-{i}"])
                             for i in range(count)]
        cluster.wait_live_workers(sum(GROUPS.values()), timeout=180)
        texts, reference, token_ids = workload
        load = MixedLoad(cluster.url, texts, reference, token_ids, clients=3, timeout_s=90).start()
        time.sleep(3)
        doomed = [f"host-a-{i}" for i in range(GROUPS["host-a"])]
        end = time.monotonic() + 60
        while inflight_on(metrics_url, doomed) == 0 and time.monotonic() < end:
            time.sleep(0.05)  # kill the group while it holds chunks
        for worker in groups["host-a"]:
            worker.signal(signal.SIGKILL)
        sent_before_kill = load.report.sent
        time.sleep(12)
        report = load.finish()
        print("\n" + report.summary("kill -9 one of three worker groups (CurveZMQ) during load") +
              f"; {metric(metrics_url, 'quiver_broker_requeues_total'):.0f} chunks dispatched again")
        failures = report.failures()
        assert not failures, [(f.kind, f.status, f.detail) for f in failures[:5]]
        assert report.sent > sent_before_kill > 0
        assert all(not worker.alive() for worker in groups["host-a"])
        cluster.wait_live_workers(sum(GROUPS.values()) - GROUPS["host-a"], timeout=30)
        assert metric(metrics_url, "quiver_broker_worker_up", {"worker": "host-b-0"}) == 1
        broker_log = cluster.broker.log() if cluster.broker else ""
        for name in doomed:  # the broker found each killed worker silent (and re-dispatched what it held)
            assert f"worker {name} missed" in broker_log
