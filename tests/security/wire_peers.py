"""Rogue and honest peers for the wire's adversarial tests: plain pyzmq DEALER sockets speaking the
protocol to a real broker process, and a scrape of the broker's refusal counters."""

from __future__ import annotations

import time

import httpx
import numpy as np
import zmq

from quiver.common.protocol import PROTOCOL_VERSION, Chunk, Heartbeat, Ready, Result, decode
from quiver.common.transport import make_socket, send
from tests.cluster import Cluster, free_port

SECRET = "s3cret-for-this-test-only"
INTERVAL = 1.0  # the default: a liveness window of 3 s, longer than any wait here
DIM = 4


class Peer:
    """A DEALER speaking the protocol, as a frontend, a worker or an impostor would."""

    def __init__(self, ctx: zmq.Context, endpoint: str, identity: bytes | None = None) -> None:
        self.sock = make_socket(ctx, zmq.DEALER, identity=identity)
        self.sock.connect(endpoint)

    def send(self, message) -> None:
        send(self.sock, message)

    def recv(self, timeout: float = 5.0, skip_heartbeats: bool = True):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.sock.poll(max(1, int((end - time.monotonic()) * 1000))):
                message = decode(self.sock.recv_multipart())
                if skip_heartbeats and isinstance(message, Heartbeat):
                    continue
                return message
        return None

    def register(self, name: str, secret: str = SECRET, output_dim: int = DIM, fingerprint: str = "") -> None:
        self.send(Ready(version=PROTOCOL_VERSION, name=name, model="m", device="cpu", capacity_tokens=1000,
                        output_dim=output_dim, secret=secret, fingerprint=fingerprint, tasks=["embed"], pid=1))

    def live_workers(self) -> int:
        self.send(Heartbeat())
        reply = self.recv(skip_heartbeats=False)
        assert isinstance(reply, Heartbeat)
        return reply.live_workers

    def wait_workers(self, count: int, timeout: float = 10.0) -> None:
        end = time.monotonic() + timeout
        while self.live_workers() != count:
            assert time.monotonic() < end, f"the broker never reported {count} live workers"
            time.sleep(0.05)


def make_chunk(chunk_id: str, num_seqs: int = 2, tokens_each: int = 3) -> Chunk:
    return Chunk(chunk_id=chunk_id, task="embed", num_seqs=num_seqs, num_tokens=num_seqs * tokens_each,
                 normalize=True, timeout_s=30.0, input_ids=np.arange(num_seqs * tokens_each, dtype=np.int32),
                 seq_lens=np.full(num_seqs, tokens_each, dtype=np.int32))


def make_result(chunk: Chunk, rows: int | None = None, dim: int = DIM, dtype: str = "float32",
                fill: float = 1.0) -> Result:
    rows = chunk.num_seqs if rows is None else rows
    values = np.full((rows, dim), fill, dtype=np.float16 if dtype == "float16" else np.float32)
    return Result(chunk_id=chunk.chunk_id, num_seqs=rows, dim=dim, dtype=dtype, worker="w", values=values)


def start_broker(*args: str, secret: str = SECRET) -> Cluster:
    """A real broker process (no workers or frontend), its /metrics on a free port."""
    cluster = Cluster(workers=0, heartbeat_interval_s=INTERVAL, env={"QUIVER_CLUSTER_SECRET": secret} if secret else {},
                      broker_args=["--metrics-port", str(port := free_port()), *args])
    cluster.metrics_url = f"http://127.0.0.1:{port}/metrics"  # type: ignore[attr-defined]
    cluster.start_broker()
    # Return once the broker process is up: on a busy machine its start-up outlasts a peer's wait for a reply.
    end = time.monotonic() + 60
    while not _answers(cluster.metrics_url):  # type: ignore[attr-defined]
        assert cluster.broker is not None and cluster.broker.alive() and time.monotonic() < end, \
            cluster.broker.log() if cluster.broker else "no broker"
        time.sleep(0.05)
    return cluster


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def refused(cluster: Cluster, message: str, reason: str) -> float:
    """quiver_broker_refused_messages_total{message, reason} as the broker serves it now."""
    end = time.monotonic() + 10
    while True:
        try:
            text = httpx.get(cluster.metrics_url, timeout=2).text  # type: ignore[attr-defined]
            break
        except httpx.HTTPError:
            assert time.monotonic() < end, "the broker's /metrics never answered"
            time.sleep(0.1)
    wanted = f'quiver_broker_refused_messages_total{{message="{message}",reason="{reason}"}}'
    for line in text.splitlines():
        if line.startswith(wanted):
            return float(line.split()[-1])
    return 0.0
