"""The broker refuses a worker whose model differs from the one its frontends
expect (fingerprints over config, tokenizer and weights' identity), so no chunk ever runs on another
model; the refused worker is told why."""

from __future__ import annotations

import shutil
import time

import numpy as np
import pytest
import zmq
from safetensors.numpy import load_file, save_file

from quiver.common.fingerprint import model_fingerprint
from quiver.common.model_info import default_model_dir
from quiver.common.protocol import Chunk, Disconnect, Error, Heartbeat
from quiver.common.security import new_cluster_secret
from tests.cluster import Cluster
from tests.security.wire_peers import Peer, make_chunk, refused, start_broker


@pytest.fixture(scope="module")
def other_weights(tmp_path_factory) -> str:
    """The packaged checkpoint with every weight moved a little: same config, tokenizer and tensor
    layout (an identical safetensors header), another model."""
    path = tmp_path_factory.mktemp("models") / "perturbed"
    shutil.copytree(default_model_dir(), path)
    tensors = load_file(str(path / "model.safetensors"))
    rng = np.random.default_rng(0)
    save_file({k: (v + rng.normal(0, 0.05, v.shape)).astype(v.dtype) for k, v in tensors.items()},
              str(path / "model.safetensors"), metadata={"format": "pt"})
    return str(path)


def test_the_fingerprint_names_the_model_not_the_copy(other_weights, tmp_path):
    packaged = model_fingerprint(default_model_dir())
    copy = tmp_path / "copy"
    shutil.copytree(default_model_dir(), copy)
    assert model_fingerprint(copy) == packaged
    assert model_fingerprint(other_weights) != packaged
    config = (copy / "config.json").read_text().replace('"hidden_act": "gelu"', '"hidden_act": "relu"')
    (copy / "config.json").write_text(config)
    assert model_fingerprint(copy) != packaged


def test_a_worker_of_another_model_is_refused_and_gets_no_chunk():
    cluster = start_broker()
    ctx = zmq.Context()
    try:
        early = Peer(ctx, cluster.worker_endpoint)
        early.register("early-other", fingerprint="bbbb")  # before any frontend said what it expects
        front = Peer(ctx, cluster.frontend_endpoint)
        front.wait_workers(1)
        front.send(Heartbeat(fingerprint="aaaa", model="model-a"))
        assert isinstance(front.recv(skip_heartbeats=False), Heartbeat)
        told = early.recv()
        assert isinstance(told, Disconnect) and "model-a" in told.reason and "bbbb" in told.reason
        other = Peer(ctx, cluster.worker_endpoint)
        other.register("other", fingerprint="bbbb")
        assert isinstance(other.recv(), Disconnect)
        assert front.live_workers() == 0
        front.send(make_chunk("c1"))
        assert other.recv(0.5) is None and early.recv(0.5) is None
        same = Peer(ctx, cluster.worker_endpoint)
        same.register("same", fingerprint="aaaa")
        assert isinstance(same.recv(), Chunk)
        assert refused(cluster, "READY", "model") == 2
        stranger = Peer(ctx, cluster.frontend_endpoint)  # a frontend of another model gets no worker
        stranger.send(Heartbeat(fingerprint="cccc", model="model-c"))
        reply = stranger.recv(skip_heartbeats=False)
        assert isinstance(reply, Heartbeat) and reply.live_workers == 0
        stranger.send(make_chunk("c2"))
        answer = stranger.recv()
        assert isinstance(answer, Error) and answer.code == "unavailable"
        assert same.recv(0.5) is None
    finally:
        ctx.destroy(linger=0)
        cluster.stop()


def test_a_real_worker_with_other_weights_is_refused_beside_an_honest_one(other_weights):
    cluster = Cluster(workers=1, env={"QUIVER_CLUSTER_SECRET": new_cluster_secret()})
    with cluster:
        wrong = cluster.start_worker(extra=["--model", other_weights])
        end = time.monotonic() + 120
        while "the broker sent DISCONNECT" not in wrong.log() and time.monotonic() < end:
            time.sleep(0.5)
        assert "fingerprint" in wrong.log() and "expect" in wrong.log()
        assert "refused a READY" in cluster.broker.log()
        assert cluster.health().json()["live_workers"] == 1
