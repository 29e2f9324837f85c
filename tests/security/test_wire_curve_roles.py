"""CurveZMQ: a key is bound to its role. A frontend's key pair, admitted on the
frontend endpoint, cannot register as a worker; a worker's key cannot speak as a frontend."""

from __future__ import annotations

import shutil

import zmq

from quiver.common.protocol import Heartbeat
from quiver.common.security import CurveClient, make_keys
from tests.security.wire_peers import Peer, start_broker


def curve_peer(ctx: zmq.Context, endpoint: str, secret_file, broker_public) -> Peer:
    peer = Peer.__new__(Peer)
    peer.sock = ctx.socket(zmq.DEALER)
    peer.sock.setsockopt(zmq.LINGER, 0)
    CurveClient(str(secret_file), str(broker_public)).apply(peer.sock)
    peer.sock.connect(endpoint)
    return peer


def test_a_frontend_key_cannot_register_as_a_worker(tmp_path):
    keys, frontends, workers = tmp_path / "keys", tmp_path / "frontends", tmp_path / "workers"
    frontends.mkdir()
    workers.mkdir()
    broker_public, broker_secret = make_keys(keys, "broker")
    for name, directory in (("frontend", frontends), ("worker", workers)):
        public, _ = make_keys(keys, name)
        shutil.copy(public, directory / public.name)
    cluster = start_broker("--curve-secret-key", str(broker_secret), "--curve-frontend-keys-dir", str(frontends),
                           "--curve-worker-keys-dir", str(workers), secret="")
    ctx = zmq.Context()
    try:
        front = curve_peer(ctx, cluster.frontend_endpoint, keys / "frontend.key_secret", broker_public)
        assert front.live_workers() == 0
        impostor = curve_peer(ctx, cluster.worker_endpoint, keys / "frontend.key_secret", broker_public)
        impostor.register("impostor")
        assert impostor.recv(1.5, skip_heartbeats=False) is None  # the handshake failed: nothing comes back
        assert front.live_workers() == 0
        worker_as_frontend = curve_peer(ctx, cluster.frontend_endpoint, keys / "worker.key_secret", broker_public)
        worker_as_frontend.send(Heartbeat())
        assert worker_as_frontend.recv(1.5, skip_heartbeats=False) is None
        honest = curve_peer(ctx, cluster.worker_endpoint, keys / "worker.key_secret", broker_public)
        honest.register("honest")
        front.wait_workers(1)
    finally:
        ctx.destroy(linger=0)
        cluster.stop()
