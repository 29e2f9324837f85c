"""What the broker reads of each message: its sender's identity and the message, CHUNK and RESULT unread;
and whether a RESULT has the shape its chunk and worker imply (`result_fault`).

`read` gives what `protocol.split_identity` and `protocol.peek` give, with the same checks. A CHUNK or
a dense RESULT, nearly every message under load, is checked in one pass here (the same msgpack limits,
the same header fields, the message class's own `check`, the same frame lengths); a message of any
other type or shape, or one that fails a check here, goes through `split_identity` and `peek`, which
accept it or raise the ProtocolError that names its fault.
"""

from __future__ import annotations

import functools
from dataclasses import fields
from typing import Any

import msgpack
import zmq

from quiver.broker.dispatch import PendingChunk, WorkerState
from quiver.common.protocol import (
    MAX_HEADER_BYTES, MAX_TEXT_CHARS, PER_TOKEN_TASKS, RESULT_DTYPES, TASK_TOKENS, Chunk, Message, MsgType, Result,
    Routed, peek, split_identity,
)

# The type frames of the messages read here, each with the fields its header may hold.
_ROUTED_TYPES: dict[bytes, tuple[MsgType, type[Message], frozenset[str]]] = {
    bytes([cls.TYPE]): (cls.TYPE, cls, frozenset(f.name for f in fields(cls)) - set(cls.ARRAY_FIELDS))
    for cls in (Chunk, Result)
}
# Frames of a well-formed message: identity, type, header and its arrays (a CHUNK's two, or three with
# token types; a dense RESULT's one).
_CHUNK_FRAMES = 5
_RESULT_FRAMES = 4
# msgpack's limits as protocol._decode_header sets them, bound once (keyword arguments cost a fifth of a decode).
_unpack_header = functools.partial(msgpack.unpackb, raw=False, strict_map_key=True, max_str_len=MAX_TEXT_CHARS,
                                   max_bin_len=0, max_array_len=64, max_map_len=64, max_ext_len=0)


def read(frames: list[zmq.Frame]) -> tuple[bytes, Message | Routed]:
    """(sender's identity, message) of a message received on a ROUTER, frames as received (copy=False).
    Raises ProtocolError on bad input."""
    routed = _ROUTED_TYPES.get(frames[1].bytes) if len(frames) >= _RESULT_FRAMES else None
    if routed is not None and len(frames[2]) <= MAX_HEADER_BYTES:
        msg_type, cls, header_fields = routed
        try:
            header = _unpack_header(frames[2].bytes)  # from bytes: a Frame's buffer costs a third of a decode
        except Exception:  # noqa: BLE001 - malformed: peek below raises the error that says so
            header = None
        if type(header) is dict and header.keys() <= header_fields:
            cls.check(header)
            if _array_lengths_match(msg_type, header, frames):
                return frames[0].bytes, Routed(msg_type, header, frames[1:])
    identity, message = split_identity(frames)
    return identity, peek(message)


def _array_lengths_match(msg_type: MsgType, header: dict[str, Any], frames: list[zmq.Frame]) -> bool:
    """Whether the array frames of a checked CHUNK or RESULT header are the usual ones, of the byte
    lengths it implies (False for a sparse or token-rows RESULT, which peek checks)."""
    if msg_type is MsgType.CHUNK:
        ids_bytes = 4 * header["num_tokens"]
        if header.get("has_token_types"):
            return (len(frames) == _CHUNK_FRAMES + 1 and len(frames[3]) == ids_bytes
                    and len(frames[4]) == 4 * header["num_seqs"] and len(frames[5]) == ids_bytes)
        return len(frames) == _CHUNK_FRAMES and len(frames[3]) == ids_bytes and len(frames[4]) == 4 * header["num_seqs"]
    if "nnz" in header or "num_rows" in header:
        return False
    values_bytes = header["num_seqs"] * header["dim"] * RESULT_DTYPES[header.get("dtype", "float32")].itemsize
    return len(frames) == _RESULT_FRAMES and len(frames[3]) == values_bytes


def result_fault(header: dict[str, Any], chunk: PendingChunk, worker: WorkerState) -> tuple[str, Any, Any] | None:
    """What is wrong with a RESULT's shape for its chunk, as (reason, what it says, what is due), or None.
    Due: one row of the worker's output width and dtype per sequence, dense; for a TASK_TOKENS chunk one
    row of the worker's token width per token, for a TASK_LEXICAL one one number per token."""
    dtype = header.get("dtype", "float32")
    if chunk.task not in PER_TOKEN_TASKS:
        if (header["num_seqs"] == chunk.num_seqs and header["dim"] == worker.output_dim
                and "num_rows" not in header and dtype == worker.output_dtype):
            return None  # what nearly every result is, told in one test
        rows = [("token_rows", header.get("num_rows"), None), ("dim", header["dim"], worker.output_dim)]
    else:
        rows = [("sparse", header.get("nnz"), None), ("token_rows", header.get("num_rows"), chunk.num_tokens),
                ("dim", header["dim"], worker.token_dim if chunk.task == TASK_TOKENS else 1)]
    for reason, got, expected in (("rows", header["num_seqs"], chunk.num_seqs), *rows,
                                  ("dtype", dtype, worker.output_dtype)):
        if got != expected:
            return reason, got, expected
    return None
