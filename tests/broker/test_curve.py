"""CurveZMQ between hosts: a broker with keys admits a worker whose key it lists and refuses others;
and it refuses to bind a non-loopback endpoint without keys."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import httpx

from quiver.common.security import make_keys
from tests.cluster import Cluster


def test_worker_with_the_right_key_serves_and_one_with_a_wrong_key_is_refused(tmp_path):
    keys, strangers = tmp_path / "keys", tmp_path / "strangers"
    broker_public, broker_secret = make_keys(keys, "broker")
    for name in ("frontend", "worker"):
        public, _ = make_keys(keys, name)
        (tmp_path / name).mkdir()
        shutil.copy(public, tmp_path / name / public.name)
    make_keys(strangers, "intruder")  # a valid key pair the broker was never told about

    def client(name: str, directory=keys) -> list[str]:
        return ["--curve-secret-key", str(directory / f"{name}.key_secret"), "--curve-broker-key", str(broker_public)]

    cluster = Cluster(workers=0, broker_args=["--curve-secret-key", str(broker_secret),
                                              "--curve-frontend-keys-dir", str(tmp_path / "frontend"),
                                              "--curve-worker-keys-dir", str(tmp_path / "worker")],
                      frontend_args=client("frontend"))
    with cluster:
        intruder = cluster.start_worker(extra=client("intruder", strangers))
        time.sleep(3)
        assert cluster.health().status_code == 503  # the broker answers the frontend, but no worker got in
        assert intruder.alive()
        cluster.start_worker(extra=client("worker"))
        cluster.wait_live_workers(1, timeout=60)
        response = httpx.post(cluster.url + "/embed", json={"inputs": "over an encrypted link"}, timeout=30)
        assert response.status_code == 200 and len(response.json()[0]) == 384
        time.sleep(1)
        assert cluster.health().json()["live_workers"] == 1


def test_a_frontend_without_keys_gets_nothing_from_a_curve_broker(tmp_path):
    broker_public, broker_secret = make_keys(tmp_path, "broker")
    (tmp_path / "authorized").mkdir()
    cluster = Cluster(workers=0, broker_args=["--curve-secret-key", str(broker_secret),
                                              "--curve-authorized-dir", str(tmp_path / "authorized")])
    cluster.start_broker()
    cluster.start_frontend()
    try:
        end = time.monotonic() + 30
        while time.monotonic() < end:  # until the frontend answers HTTP at all
            try:
                cluster.health()
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        time.sleep(1.5)  # past the liveness window: its heartbeats never got an answer
        response = cluster.health()
        assert response.status_code == 503 and "unreachable" in response.json()["error"]
    finally:
        cluster.stop()


def test_broker_refuses_an_exposed_endpoint_without_keys():
    result = subprocess.run(
        [sys.executable, "-m", "quiver", "broker", "--frontend-endpoint", "tcp://0.0.0.0:0",
         "--worker-endpoint", "tcp://127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "CurveZMQ" in result.stderr and "0.0.0.0" in result.stderr
