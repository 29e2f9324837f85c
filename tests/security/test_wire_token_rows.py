"""Token-row results through a real broker: a "tokens" chunk is answered only by one row of the worker's
declared token width per token of the chunk, a "lexical" chunk only by one number per token, and a pooled
chunk never by token rows."""

from __future__ import annotations

import numpy as np
import pytest
import zmq

from quiver.common.protocol import PROTOCOL_VERSION, Chunk, Ready, Result
from tests.security.wire_peers import DIM, SECRET, Peer, make_chunk, refused, start_broker

TOKEN_DIM = DIM + 1


@pytest.fixture
def peers():
    cluster = start_broker()
    ctx = zmq.Context()
    front = Peer(ctx, cluster.frontend_endpoint)
    worker = Peer(ctx, cluster.worker_endpoint)
    worker.send(Ready(version=PROTOCOL_VERSION, name="w", model="m", device="cpu", capacity_tokens=1000,
                      output_dim=DIM, secret=SECRET, tasks=["embed", "tokens", "lexical"], pid=1, token_dim=TOKEN_DIM))
    front.wait_workers(1)
    yield cluster, front, worker
    ctx.destroy(linger=0)
    cluster.stop()


def _token_result(chunk: Chunk, rows: int | None = None, dim: int = TOKEN_DIM) -> Result:
    rows = chunk.num_tokens if rows is None else rows
    return Result(chunk_id=chunk.chunk_id, num_seqs=chunk.num_seqs, dim=dim, num_rows=rows, worker="w",
                  values=np.ones((rows, dim), dtype=np.float32))


def _tokens_chunk(chunk_id: str, task: str = "tokens") -> Chunk:
    chunk = make_chunk(chunk_id)
    chunk.task = task
    return chunk


@pytest.mark.parametrize("answer,reason", [
    (lambda c: _token_result(c, rows=c.num_tokens - 1), "token_rows"),
    (lambda c: _token_result(c, dim=DIM), "dim"),  # the pooled width, not the token width
    (lambda c: Result(chunk_id=c.chunk_id, num_seqs=c.num_seqs, dim=DIM, worker="w",
                      values=np.ones((c.num_seqs, DIM), dtype=np.float32)), "token_rows"),
])
def test_a_tokens_chunk_takes_only_its_token_rows(peers, answer, reason):
    cluster, front, worker = peers
    front.send(_tokens_chunk("c1"))
    given = worker.recv()
    assert isinstance(given, Chunk) and given.task == "tokens"
    worker.send(answer(given))
    assert front.recv(0.7) is None
    assert refused(cluster, "RESULT", reason) == 1
    worker.send(_token_result(given))
    reply = front.recv()
    assert isinstance(reply, Result) and reply.values.shape == (given.num_tokens, TOKEN_DIM)


def test_a_pooled_chunk_is_never_answered_by_token_rows(peers):
    cluster, front, worker = peers
    front.send(make_chunk("c2"))
    given = worker.recv()
    worker.send(_token_result(given, dim=DIM))
    assert front.recv(0.7) is None
    assert refused(cluster, "RESULT", "token_rows") == 1


@pytest.mark.parametrize("answer,reason", [
    (lambda c: _token_result(c), "dim"),  # whole token rows where the lexical weights alone were asked for
    (lambda c: _token_result(c, rows=c.num_tokens + 1, dim=1), "token_rows"),
])
def test_a_lexical_chunk_takes_only_one_number_per_token(peers, answer, reason):
    cluster, front, worker = peers
    front.send(_tokens_chunk("c3", "lexical"))
    given = worker.recv()
    assert isinstance(given, Chunk) and given.task == "lexical"
    worker.send(answer(given))
    assert front.recv(0.7) is None
    assert refused(cluster, "RESULT", reason) == 1
    worker.send(_token_result(given, dim=1))
    reply = front.recv()
    assert isinstance(reply, Result) and reply.values.shape == (given.num_tokens, 1)
