"""broker.wire.read against protocol.split_identity + protocol.peek: the same messages accepted, the
same ones refused; and broker.wire.result_fault, the shape a RESULT must have for its chunk and worker."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import zmq

from quiver.broker.dispatch import WorkerState
from quiver.broker.wire import read, result_fault
from quiver.common.protocol import TASKS, Chunk, Heartbeat, ProtocolError, Result, peek, split_identity
from tests.broker.test_dispatch import pending

IDENTITY = b"peer-identity"


def chunk(**changes) -> Chunk:
    fields = dict(chunk_id="c1", task="embed", num_seqs=2, num_tokens=6, normalize=True, timeout_s=5.0,
                  input_ids=np.arange(6, dtype=np.int32), seq_lens=np.array([2, 4], dtype=np.int32))
    return Chunk(**{**fields, **changes})


def result(**changes) -> Result:
    fields = dict(chunk_id="c1", num_seqs=2, dim=3, values=np.ones((2, 3), dtype=np.float32))
    return Result(**{**fields, **changes})


def received(frames: list) -> list[zmq.Frame]:
    return [zmq.Frame(IDENTITY), *(zmq.Frame(bytes(memoryview(f))) for f in frames)]


def reference(frames: list[zmq.Frame]):
    identity, message = split_identity(frames)
    return identity, peek(message)


WELL_FORMED = [
    chunk().encode(),
    chunk(has_token_types=True, token_type_ids=np.zeros(6, dtype=np.int32)).encode(),
    chunk(priority=1, model="fp", traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01").encode(),
    result().encode(),
    result(dtype="float16", values=np.ones((2, 3), dtype=np.float16)).encode(),
    result(num_seqs=1, nnz=1, values=np.ones(1, dtype=np.float32), row_counts=np.array([1], dtype=np.int32),
           indices=np.array([2], dtype=np.int32)).encode(),
    Heartbeat().encode(),
]


@pytest.mark.parametrize("frames", WELL_FORMED)
def test_a_well_formed_message_reads_as_peek_reads_it(frames):
    frames = received(frames)
    assert read(frames) == reference(frames)


def header_with(message_frames: list, **changes) -> list:
    header = {**msgpack.unpackb(bytes(memoryview(message_frames[1]))), **changes}
    return [message_frames[0], msgpack.packb(header), *message_frames[2:]]


MALFORMED = [
    chunk().encode()[:3],  # a frame short
    [*chunk().encode(), b"extra"],
    header_with(chunk().encode(), num_tokens=7),  # the ids frame is shorter than the header says
    header_with(chunk().encode(), task=["embed"]),  # a list in a string field
    header_with(chunk().encode(), chunk_id={"a": 1}),
    header_with(chunk().encode(), unknown=1),
    header_with(chunk().encode(), input_ids=[1, 2]),
    header_with(result().encode(), dim=4),
    header_with(result().encode(), dtype={"float32": 1}),
    [b"\x06\x06", *chunk().encode()[1:]],  # a type frame of two bytes
    [chunk().encode()[0], b"\xc1", *chunk().encode()[2:]],  # not msgpack
    [chunk().encode()[0], msgpack.packb([1, 2]), *chunk().encode()[2:]],  # not a map
    [chunk().encode()[0], b"\x00" * (64 * 1024 + 1), *chunk().encode()[2:]],  # over the header limit
]


@pytest.mark.parametrize("frames", MALFORMED)
def test_a_malformed_message_is_refused_as_peek_refuses_it(frames):
    with pytest.raises(ProtocolError) as expected:
        reference(received(frames))
    with pytest.raises(ProtocolError) as got:
        read(received(frames))
    assert str(got.value) == str(expected.value)


def test_a_message_with_no_more_than_an_identity_and_a_type_is_refused():
    with pytest.raises(ProtocolError):
        read([zmq.Frame(IDENTITY), zmq.Frame(b"\x06")])


_WORKER = WorkerState(identity=b"w", name="w", device="cpu", capacity_tokens=100, tasks=frozenset(TASKS),
                      expiry=10.0, output_dim=4, output_dtype="float16", token_dim=3)


@pytest.mark.parametrize("task, header, fault", [
    ("embed", dict(num_seqs=2, dim=4, dtype="float16"), None),
    ("score", dict(num_seqs=2, dim=4, dtype="float16"), None),
    ("embed", dict(num_seqs=3, dim=4, dtype="float16"), ("rows", 3, 2)),
    ("embed", dict(num_seqs=2, dim=5, dtype="float16"), ("dim", 5, 4)),
    ("embed", dict(num_seqs=2, dim=4), ("dtype", "float32", "float16")),
    ("embed", dict(num_seqs=2, dim=4, dtype="float16", num_rows=6), ("token_rows", 6, None)),
    ("tokens", dict(num_seqs=2, dim=3, dtype="float16", num_rows=6), None),
    ("tokens", dict(num_seqs=2, dim=4, dtype="float16", num_rows=6), ("dim", 4, 3)),
    ("tokens", dict(num_seqs=2, dim=3, dtype="float16", num_rows=5), ("token_rows", 5, 6)),
    ("tokens", dict(num_seqs=2, dim=3, dtype="float16"), ("token_rows", None, 6)),
    ("tokens", dict(num_seqs=2, dim=3, dtype="float16", num_rows=6, nnz=4), ("sparse", 4, None)),
    ("lexical", dict(num_seqs=2, dim=1, dtype="float16", num_rows=6), None),
    ("lexical", dict(num_seqs=2, dim=3, dtype="float16", num_rows=6), ("dim", 3, 1)),
])
def test_a_result_has_the_shape_its_chunk_and_worker_imply(task, header, fault):
    """One pooled row of the worker's width and dtype per sequence; for a tokens chunk one row of the
    worker's token width per token; for a lexical one one number per token; the first fault is named."""
    assert result_fault({"chunk_id": "c", **header}, pending("c", tokens=6, task=task, seqs=2), _WORKER) == fault
