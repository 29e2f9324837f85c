"""Every message that crosses a ZeroMQ socket, in one module.

A message is a list of frames: one type byte, one msgpack header, then zero or more raw array frames.
Headers are plain maps checked on receipt against a schema of field types and size limits; arrays
travel as raw little-endian bytes (token ids int32, results float32). Nothing is pickled.

    frontend ──CHUNK──▶ broker ──CHUNK──▶ worker
    frontend ◀─RESULT/ERROR── broker ◀─RESULT/ERROR── worker
    worker ──READY──▶ broker; HEARTBEAT both ways on every link; broker ──RECONNECT──▶ unknown worker

ROUTER sockets prepend the peer identity frame; `split_identity` strips it before decoding. The
endpoints use `decode`, which builds numpy arrays over the received frames; the broker uses `peek`,
which checks the type byte, the header and the frames' byte lengths and leaves array frames unread.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any, Callable, ClassVar, Collection, Sequence

import msgpack
import numpy as np
import numpy.typing as npt

from quiver.common.ragged import RaggedError, RaggedIds

PROTOCOL_VERSION = 3  # 3: the "lexical" task

MAX_HEADER_BYTES = 64 * 1024
MAX_ARRAY_BYTES = 256 * 1024 * 1024
MAX_SEQS_PER_CHUNK = 65_536
MAX_ID_CHARS = 128
MAX_SECRET_CHARS = 256
MAX_RESULT_DIM = 1 << 20
MAX_TEXT_CHARS = 4096
MAX_TRACEPARENT_CHARS = 128  # W3C traceparent: 55 characters in version 00, room for later versions' fields
MAX_SECONDS = 1e9  # any duration a header carries
MAX_TIMEOUT_S = 86_400.0  # a chunk's timeout
MAX_ATTEMPT = 1000  # a chunk's dispatch attempts
# The largest frame any message carries: every socket refuses (disconnects) a peer sending more.
MAX_FRAME_BYTES = max(MAX_ARRAY_BYTES, MAX_HEADER_BYTES)

# Dtypes a RESULT's values may travel in, by the name READY and RESULT give them.
RESULT_DTYPES: dict[str, np.dtype] = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2")}

assert sys.byteorder == "little", "raw array frames are little-endian"


class ProtocolError(ValueError):
    """A message that does not follow this module's rules; the receiver drops it and counts it."""


class MsgType(enum.IntEnum):
    READY = 1
    HEARTBEAT = 2
    CHUNK = 3
    RESULT = 4
    ERROR = 5
    DISCONNECT = 6
    RECONNECT = 7
    CANCEL = 8


class ErrorCode(str, enum.Enum):
    """Why a chunk failed; the frontend maps each to an HTTP status."""

    BAD_INPUT = "bad_input"  # 422: the worker rejected the sequences
    OVERLOADED = "overloaded"  # 429: the broker's queue is full
    UNAVAILABLE = "unavailable"  # 503: no worker could finish it
    EXPIRED = "expired"  # 504: its deadline passed before it ran
    INTERNAL = "internal"  # 500: the model failed


ERROR_CODES = frozenset(code.value for code in ErrorCode)


# Tasks a chunk asks of the worker; the model decides which it supports.
TASK_EMBED = "embed"
TASK_SCORE = "score"
TASK_CLASSIFY = "classify"
# Every token's row instead of one pooled row per sequence (BGE-M3's sparse and ColBERT outputs, token
# vectors, contextual chunks pooled by the frontend); the result's rows follow the chunk's tokens.
TASK_TOKENS = "tokens"
# BGE-M3's lexical weight alone: one row per token holding only the last column of its token row, so
# that a sparse-only request moves one number per token instead of the ColBERT vector beside it.
TASK_LEXICAL = "lexical"
TASKS = (TASK_EMBED, TASK_SCORE, TASK_CLASSIFY, TASK_TOKENS, TASK_LEXICAL)
PER_TOKEN_TASKS = frozenset({TASK_TOKENS, TASK_LEXICAL})  # answered with one row per token

# A chunk's priority: online requests go before background (bulk) work at the broker and in each step.
PRIORITY_ONLINE = 0
PRIORITY_BACKGROUND = 1


def _check_str(name: str, value: Any, limit: int = MAX_ID_CHARS) -> None:
    if not isinstance(value, str) or len(value) > limit:
        raise ProtocolError(f"field {name!r} must be a string of at most {limit} characters")


def _check_choice(name: str, value: Any, choices: Collection[str]) -> None:
    """`value` is one of `choices`, strings; a peer's list or map is refused, never hashed into a set or dict."""
    if type(value) is not str or value not in choices:
        raise ProtocolError(f"field {name!r} must be one of {sorted(choices)}")


def _check_int(name: str, value: Any, low: int = 0, high: int = 2**62) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ProtocolError(f"field {name!r} must be an integer in [{low}, {high}]")


def _check_float(name: str, value: Any, low: float = 0.0, high: float = MAX_SECONDS) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= float(value) <= high:
        raise ProtocolError(f"field {name!r} must be a number in [{low}, {high}]")


def _check_map(name: str, value: Any, check_value: Callable[[str, Any], None]) -> None:
    """A map from identifiers (fingerprints) to values each checked by `check_value`."""
    if not isinstance(value, dict):
        raise ProtocolError(f"field {name!r} must be a map")
    for key, item in value.items():
        _check_str(f"a key of {name}", key)
        check_value(f"{name}[{key}]", item)


def _check_bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ProtocolError(f"field {name!r} must be a boolean")


def _array_frame(name: str, frame: bytes | memoryview, dtype: npt.DTypeLike, count: int) -> np.ndarray:
    buf = memoryview(frame)
    expected = count * np.dtype(dtype).itemsize
    if buf.nbytes != expected:
        raise ProtocolError(f"frame {name!r} holds {buf.nbytes} bytes, header says {expected}")
    return np.frombuffer(buf, dtype=dtype)


@dataclass
class Message:
    """Base of every message: subclasses declare TYPE, header fields and how to check them."""

    TYPE: ClassVar[MsgType]
    # The fields the header carries, in order (every field but the array frames'): set below, once.
    HEADER_FIELDS: ClassVar[tuple[str, ...]] = ()

    def header(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.HEADER_FIELDS}

    def arrays(self) -> list[bytes | memoryview]:
        return []

    def encode(self) -> list[bytes | memoryview]:
        header = msgpack.packb(self.header(), use_bin_type=True)
        if len(header) > MAX_HEADER_BYTES:
            raise ProtocolError(f"{self.TYPE.name} header is {len(header)} bytes, over {MAX_HEADER_BYTES}")
        return [bytes([self.TYPE]), header, *self.arrays()]

    @classmethod
    def check(cls, header: dict[str, Any]) -> None:
        """Raise ProtocolError when a field is missing, mistyped or out of bounds."""

    @classmethod
    def from_parts(cls, header: dict[str, Any], arrays: Sequence[bytes | memoryview]) -> Message:
        if arrays:
            raise ProtocolError(f"{cls.TYPE.name} carries no array frames")
        return cls(**header)


@dataclass
class Ready(Message):
    """A worker offers itself: its protocol version, identity, how much work it takes at once, the
    shape of its results (output_dim values of output_dtype per sequence), the fingerprint of its
    model (common.fingerprint.model_fingerprint) and the cluster secret the broker may require."""

    TYPE: ClassVar[MsgType] = MsgType.READY
    version: int
    name: str
    model: str
    device: str
    capacity_tokens: int
    output_dim: int
    output_dtype: str = "float32"
    fingerprint: str = ""
    secret: str = field(default="", repr=False)
    tasks: list[str] = field(default_factory=lambda: [TASK_EMBED])
    pid: int = 0
    token_dim: int = 0  # width of a TASK_TOKENS result row (0: the worker does not do that task)

    @classmethod
    def check(cls, h: dict[str, Any]) -> None:
        _check_int("version", h.get("version"))
        _check_str("name", h.get("name"))
        _check_str("model", h.get("model"), 512)
        _check_str("device", h.get("device"))
        _check_int("capacity_tokens", h.get("capacity_tokens"), 1)
        _check_int("output_dim", h.get("output_dim"), 1, MAX_RESULT_DIM)
        _check_choice("output_dtype", h.get("output_dtype", "float32"), RESULT_DTYPES)
        _check_str("fingerprint", h.get("fingerprint", ""))
        _check_str("secret", h.get("secret", ""), MAX_SECRET_CHARS)
        _check_int("pid", h.get("pid", 0))
        _check_int("token_dim", h.get("token_dim", 0), 0, MAX_RESULT_DIM)
        tasks = h.get("tasks", [TASK_EMBED])
        if not isinstance(tasks, list) or not all(t in TASKS for t in tasks):
            raise ProtocolError(f"field 'tasks' must list some of {TASKS}")


@dataclass
class Heartbeat(Message):
    """I am alive. From the broker it carries `broker_id`, random per broker start, so a peer sees a
    restart however short, and to a frontend how many workers are live (`workers_by_model`: per model
    fingerprint); from a frontend, `fingerprint` and `model` name the model it expects, and `models`
    (fingerprint -> name) every model when it serves several; from a worker, `draining` says it
    finishes what it holds and wants no new chunks."""

    TYPE: ClassVar[MsgType] = MsgType.HEARTBEAT
    live_workers: int = 0
    draining: bool = False
    broker_id: str = ""
    fingerprint: str = ""
    model: str = ""
    models: dict[str, str] = field(default_factory=dict)
    workers_by_model: dict[str, int] = field(default_factory=dict)

    @classmethod
    def check(cls, h: dict[str, Any]) -> None:
        _check_int("live_workers", h.get("live_workers", 0))
        _check_bool("draining", h.get("draining", False))
        _check_str("broker_id", h.get("broker_id", ""))
        _check_str("fingerprint", h.get("fingerprint", ""))
        _check_str("model", h.get("model", ""), 512)
        _check_map("models", h.get("models", {}), lambda name, v: _check_str(name, v, 512))
        _check_map("workers_by_model", h.get("workers_by_model", {}), _check_int)

    def expected_models(self) -> dict[str, str]:
        """The models (fingerprint -> name) a frontend's heartbeat names: `models`, else its one model."""
        return self.models or ({self.fingerprint: self.model} if self.fingerprint else {})


@dataclass
class Disconnect(Message):
    """The sender is leaving on purpose (drain or shutdown); forget it without waiting for silence."""

    TYPE: ClassVar[MsgType] = MsgType.DISCONNECT
    reason: str = ""

    @classmethod
    def check(cls, h: dict[str, Any]) -> None:
        _check_str("reason", h.get("reason", ""), MAX_TEXT_CHARS)


@dataclass
class Reconnect(Message):
    """From the broker to a worker it does not know (say, after a broker restart): send READY again."""

    TYPE: ClassVar[MsgType] = MsgType.RECONNECT


@dataclass
class Cancel(Message):
    """The frontend no longer wants this chunk (its request ended); drop it if it has not started."""

    TYPE: ClassVar[MsgType] = MsgType.CANCEL
    chunk_id: str

    @classmethod
    def check(cls, h: dict[str, Any]) -> None:
        _check_str("chunk_id", h.get("chunk_id"))


@dataclass
class Chunk(Message):
    """Some sequences of one request, to be run as a unit. Idempotent: safe to run twice.

    Arrays: input_ids int32 [sum(seq_lens)], seq_lens int32 [num_seqs], and token_type_ids int32
    [sum(seq_lens)] when has_token_types: the parts of `ids` (common.ragged), which receivers read.
    `priority` is PRIORITY_ONLINE or PRIORITY_BACKGROUND (bulk jobs).
    """

    TYPE: ClassVar[MsgType] = MsgType.CHUNK
    chunk_id: str
    task: str
    num_seqs: int
    num_tokens: int
    normalize: bool
    timeout_s: float
    has_token_types: bool = False
    attempt: int = 0
    model: str = ""  # the fingerprint of the model to run it; '' for whichever the workers serve
    priority: int = PRIORITY_ONLINE
    input_ids: np.ndarray = field(kw_only=True, repr=False)
    seq_lens: np.ndarray = field(kw_only=True, repr=False)
    token_type_ids: np.ndarray | None = field(default=None, repr=False)
    traceparent: str = ""  # W3C trace context of the request's span when it is traced; workers check its format

    ARRAY_FIELDS: ClassVar[tuple[str, ...]] = ("input_ids", "seq_lens", "token_type_ids")

    def header(self) -> dict[str, Any]:
        header = super().header()
        if self.priority == PRIORITY_ONLINE:
            del header["priority"]  # an online chunk's header is what it was before priorities existed
        return header

    def arrays(self) -> list[bytes | memoryview]:
        frames: list[bytes | memoryview] = [_as_frame(self.input_ids, np.int32), _as_frame(self.seq_lens, np.int32)]
        if self.has_token_types:
            frames.append(_as_frame(self.token_type_ids, np.int32))
        return frames

    @classmethod
    def check(cls, h: dict[str, Any]) -> None:
        # Every field at once, as msgpack decodes a well-formed header (the broker checks each chunk it
        # routes); anything else goes through the checks one by one, which name the field at fault.
        get = h.get
        chunk_id, num_seqs, num_tokens, timeout_s = get("chunk_id"), get("num_seqs"), get("num_tokens"), get("timeout_s")
        attempt, model, trace, priority = get("attempt", 0), get("model", ""), get("traceparent", ""), get("priority", 0)
        if (type(chunk_id) is str and len(chunk_id) <= MAX_ID_CHARS and get("task") in TASKS
                and type(num_seqs) is int and 1 <= num_seqs <= MAX_SEQS_PER_CHUNK
                and type(num_tokens) is int and 1 <= num_tokens <= MAX_ARRAY_BYTES // 4
                and type(get("normalize")) is bool and type(get("has_token_types", False)) is bool
                and type(timeout_s) is float and 0.0 <= timeout_s <= MAX_TIMEOUT_S
                and type(attempt) is int and 0 <= attempt <= MAX_ATTEMPT
                and type(model) is str and len(model) <= MAX_ID_CHARS
                and type(trace) is str and len(trace) <= MAX_TRACEPARENT_CHARS
                and type(priority) is int and PRIORITY_ONLINE <= priority <= PRIORITY_BACKGROUND):
            return
        _check_str("chunk_id", h.get("chunk_id"))
        _check_choice("task", h.get("task"), TASKS)
        _check_int("num_seqs", h.get("num_seqs"), 1, MAX_SEQS_PER_CHUNK)
        _check_int("num_tokens", h.get("num_tokens"), 1, MAX_ARRAY_BYTES // 4)
        _check_bool("normalize", h.get("normalize"))
        _check_float("timeout_s", h.get("timeout_s"), 0.0, MAX_TIMEOUT_S)
        _check_bool("has_token_types", h.get("has_token_types", False))
        _check_int("attempt", h.get("attempt", 0), 0, MAX_ATTEMPT)
        _check_str("model", h.get("model", ""))
        _check_str("traceparent", h.get("traceparent", ""), MAX_TRACEPARENT_CHARS)
        _check_int("priority", h.get("priority", PRIORITY_ONLINE), PRIORITY_ONLINE, PRIORITY_BACKGROUND)

    @cached_property
    def ids(self) -> RaggedIds:
        """The sequences as ragged ids over this chunk's arrays (offsets summed once, on first use)."""
        return RaggedIds(self.input_ids, self.seq_lens, self.token_type_ids)

    @classmethod
    def from_ids(cls, ids: RaggedIds, **header: Any) -> Chunk:
        """A chunk of `ids`, its counts and has_token_types taken from them; `header` gives the rest."""
        chunk = cls(num_seqs=ids.num_seqs, num_tokens=ids.num_tokens, has_token_types=ids.token_type_ids is not None,
                    input_ids=ids.input_ids, seq_lens=ids.seq_lens, token_type_ids=ids.token_type_ids, **header)
        chunk.__dict__["ids"] = ids
        return chunk

    @classmethod
    def from_parts(cls, header: dict[str, Any], arrays: Sequence[bytes | memoryview]) -> Chunk:
        expected = 3 if header.get("has_token_types") else 2
        if len(arrays) != expected:
            raise ProtocolError(f"CHUNK needs {expected} array frames, got {len(arrays)}")
        try:
            ids = RaggedIds.from_frames(arrays[0], arrays[1], arrays[2] if expected == 3 else None,
                                        header["num_seqs"], header["num_tokens"])
        except RaggedError as exc:
            raise ProtocolError(str(exc)) from exc
        chunk = cls(**header, input_ids=ids.input_ids, seq_lens=ids.seq_lens, token_type_ids=ids.token_type_ids)
        chunk.__dict__["ids"] = ids
        return chunk


@dataclass
class Result(Message):
    """The outputs of one chunk: [num_seqs, dim] of dtype (float32 unless said), row i for sequence i,
    plus stage timings.

    A sparse result (nnz set: SPLADE's vocabulary-wide rows) carries only the non-zeros, in three
    frames: row_counts int32 [num_seqs] (non-zeros per row), indices int32 [nnz] (their columns,
    ascending within a row, each < dim) and values float32 [nnz]. Its dense form is [num_seqs, dim].

    A token result (num_rows set: the answer to a TASK_TOKENS or TASK_LEXICAL chunk) has one row per token
    of the chunk, sequence after sequence: values [num_rows, dim], sequence i owning seq_lens[i] rows.
    """

    TYPE: ClassVar[MsgType] = MsgType.RESULT
    chunk_id: str
    num_seqs: int
    dim: int
    dtype: str = "float32"
    queue_s: float = 0.0
    inference_s: float = 0.0
    worker: str = ""
    nnz: int | None = None
    num_rows: int | None = None
    values: np.ndarray = field(kw_only=True, repr=False)
    row_counts: np.ndarray | None = field(default=None, kw_only=True, repr=False)
    indices: np.ndarray | None = field(default=None, kw_only=True, repr=False)

    ARRAY_FIELDS: ClassVar[tuple[str, ...]] = ("values", "row_counts", "indices")

    def header(self) -> dict[str, Any]:
        header = super().header()
        if self.nnz is None:
            del header["nnz"]  # a dense result's header is what it was before sparse results existed
        if self.num_rows is None:
            del header["num_rows"]
        return header

    def arrays(self) -> list[bytes | memoryview]:
        if self.nnz is None:
            return [_as_frame(self.values, RESULT_DTYPES[self.dtype])]
        return [_as_frame(self.row_counts, np.int32), _as_frame(self.indices, np.int32),
                _as_frame(self.values, np.float32)]

    def to_sparse(self) -> Result:
        """This dense result with only its non-zeros (row-major order, so columns ascend within a row)."""
        rows, columns = np.nonzero(self.values)
        counts = np.bincount(rows, minlength=self.num_seqs).astype(np.int32)
        return Result(chunk_id=self.chunk_id, num_seqs=self.num_seqs, dim=self.dim, queue_s=self.queue_s,
                      inference_s=self.inference_s, worker=self.worker, nnz=int(rows.size),
                      values=self.values[rows, columns].astype(np.float32), row_counts=counts,
                      indices=columns.astype(np.int32))

    @classmethod
    def check(cls, h: dict[str, Any]) -> None:
        # A dense result's header as msgpack decodes it, every field at once (as in Chunk.check); anything
        # else through the checks one by one.
        get = h.get
        chunk_id, num_seqs, dim, dtype = get("chunk_id"), get("num_seqs"), get("dim"), get("dtype", "float32")
        worker = get("worker", "")
        queue_s, inference_s = get("queue_s", 0.0), get("inference_s", 0.0)
        if (type(chunk_id) is str and len(chunk_id) <= MAX_ID_CHARS
                and type(num_seqs) is int and 1 <= num_seqs <= MAX_SEQS_PER_CHUNK
                and type(dim) is int and 1 <= dim <= MAX_RESULT_DIM and type(dtype) is str and dtype in RESULT_DTYPES
                and type(queue_s) is float and 0.0 <= queue_s <= MAX_SECONDS
                and type(inference_s) is float and 0.0 <= inference_s <= MAX_SECONDS
                and type(worker) is str and len(worker) <= MAX_ID_CHARS
                and get("nnz") is None and get("num_rows") is None):
            return
        _check_str("chunk_id", h.get("chunk_id"))
        _check_int("num_seqs", h.get("num_seqs"), 1, MAX_SEQS_PER_CHUNK)
        _check_int("dim", h.get("dim"), 1, MAX_RESULT_DIM)
        _check_choice("dtype", h.get("dtype", "float32"), RESULT_DTYPES)
        _check_float("queue_s", h.get("queue_s", 0.0))
        _check_float("inference_s", h.get("inference_s", 0.0))
        _check_str("worker", h.get("worker", ""))
        if h.get("nnz") is not None:
            _check_int("nnz", h["nnz"], 0, MAX_ARRAY_BYTES // 4)
        if h.get("num_rows") is not None:
            _check_int("num_rows", h["num_rows"], 1, MAX_ARRAY_BYTES // 4)
            if h.get("nnz") is not None:
                raise ProtocolError("a RESULT is sparse (nnz) or token rows (num_rows), not both")

    @classmethod
    def from_parts(cls, header: dict[str, Any], arrays: Sequence[bytes | memoryview]) -> Result:
        if header.get("nnz") is None:
            if len(arrays) != 1:
                raise ProtocolError(f"RESULT needs 1 array frame, got {len(arrays)}")
            rows = _result_rows(header)
            dtype = RESULT_DTYPES[header.get("dtype", "float32")]
            values = _array_frame("values", arrays[0], dtype, rows * header["dim"]).reshape(rows, header["dim"])
            return cls(**header, values=values)
        if len(arrays) != 3:
            raise ProtocolError(f"a sparse RESULT needs 3 array frames, got {len(arrays)}")
        nnz = header["nnz"]
        counts = _array_frame("row_counts", arrays[0], np.int32, header["num_seqs"])
        indices = _array_frame("indices", arrays[1], np.int32, nnz)
        if int(counts.min()) < 0 or int(counts.sum(dtype=np.int64)) != nnz:
            raise ProtocolError("row_counts must be non-negative and sum to nnz")
        if nnz and (int(indices.min()) < 0 or int(indices.max()) >= header["dim"]):
            raise ProtocolError(f"sparse indices must lie in [0, {header['dim']})")
        values = _array_frame("values", arrays[2], np.float32, nnz)
        return cls(**header, values=values, row_counts=counts, indices=indices)

    def sparse_rows(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """(indices, values) per row of a sparse result."""
        assert self.nnz is not None and self.row_counts is not None and self.indices is not None
        ends = np.cumsum(self.row_counts)
        starts = ends - self.row_counts
        return [(self.indices[a:b], self.values[a:b]) for a, b in zip(starts.tolist(), ends.tolist())]


def _result_rows(header: dict[str, Any]) -> int:
    """A dense RESULT's rows: one per sequence, or for a token result (num_rows set) one per token."""
    return int(header["num_seqs"]) if header.get("num_rows") is None else int(header["num_rows"])


def result_frame_bytes(header: dict[str, Any]) -> list[int]:
    """Byte lengths of the array frames a RESULT header implies: num_seqs × dim values of its dtype, or
    for a sparse result (nnz set) the row counts, indices and values of its non-zeros; for a token result
    (num_rows set) num_rows × dim values."""
    if header.get("nnz") is not None:
        return [4 * int(header["num_seqs"]), 4 * int(header["nnz"]), 4 * int(header["nnz"])]
    return [_result_rows(header) * int(header["dim"]) * RESULT_DTYPES[header.get("dtype", "float32")].itemsize]


@dataclass
class Error(Message):
    """A chunk that will not produce a result, and why."""

    TYPE: ClassVar[MsgType] = MsgType.ERROR
    chunk_id: str
    code: str
    message: str
    worker: str = ""

    @classmethod
    def check(cls, h: dict[str, Any]) -> None:
        _check_str("chunk_id", h.get("chunk_id"))
        _check_choice("code", h.get("code"), ERROR_CODES)
        _check_str("message", h.get("message"), MAX_TEXT_CHARS)
        _check_str("worker", h.get("worker", ""))


MESSAGE_CLASSES: dict[MsgType, type[Message]] = {
    cls.TYPE: cls for cls in (Ready, Heartbeat, Disconnect, Reconnect, Cancel, Chunk, Result, Error)
}
for _cls in MESSAGE_CLASSES.values():
    _cls.HEADER_FIELDS = tuple(f.name for f in fields(_cls) if f.name not in getattr(_cls, "ARRAY_FIELDS", ()))
# Per type byte: the class, its field names, and those of them its header may hold (not its arrays'),
# looked up once (every message is checked).
_CLASSES_BY_BYTE: dict[int, tuple[MsgType, type[Message], frozenset[str], frozenset[str]]] = {
    int(kind): (kind, cls, frozenset(f.name for f in fields(cls)),
                frozenset(f.name for f in fields(cls)) - set(getattr(cls, "ARRAY_FIELDS", ())))
    for kind, cls in MESSAGE_CLASSES.items()
}


def _as_frame(array: np.ndarray | None, dtype: Any) -> memoryview:
    if array is None:
        raise ProtocolError("a required array is missing")
    array = np.ascontiguousarray(array, dtype=dtype)
    if array.nbytes > MAX_ARRAY_BYTES:
        raise ProtocolError(f"array of {array.nbytes} bytes is over the {MAX_ARRAY_BYTES} limit")
    return array.data.cast("B")


def _decode_header(frames: list[Any]) -> tuple[type[Message], dict[str, Any], list[Any]]:
    """Check the type byte and the header; return the message class, the header and the array frames
    (as received: bytes, buffers or zmq Frames, not read; receivers view them with memoryview)."""
    if len(frames) < 2:
        raise ProtocolError(f"a message needs a type frame and a header frame, got {len(frames)} frames")
    type_frame, header_frame = memoryview(frames[0]), memoryview(frames[1])
    arrays = frames[2:]
    if type_frame.nbytes != 1:
        raise ProtocolError("the type frame must be one byte")
    known_type = _CLASSES_BY_BYTE.get(type_frame[0])
    if known_type is None:
        raise ProtocolError(f"unknown message type {type_frame[0]}")
    msg_type, cls, known, header_fields = known_type
    if header_frame.nbytes > MAX_HEADER_BYTES:
        raise ProtocolError(f"header of {header_frame.nbytes} bytes is over the {MAX_HEADER_BYTES} limit")
    try:
        header = msgpack.unpackb(
            header_frame, raw=False, strict_map_key=True, max_str_len=MAX_TEXT_CHARS,
            max_bin_len=0, max_array_len=64, max_map_len=64, max_ext_len=0,
        )
    except Exception as exc:  # msgpack raises several types for malformed input
        raise ProtocolError(f"header is not valid msgpack: {exc}") from exc
    if not isinstance(header, dict):
        raise ProtocolError("header must be a map")
    if header.keys() <= header_fields:
        cls.check(header)
        return cls, header, arrays
    unknown = header.keys() - known
    if unknown:
        raise ProtocolError(f"{msg_type.name} header has unknown fields {sorted(unknown)}")
    cls.check(header)
    array_field = next(name for name in getattr(cls, "ARRAY_FIELDS", ()) if name in header)
    raise ProtocolError(f"{array_field!r} travels as a frame, not in the header")


def decode(frames: list[bytes | memoryview | Any]) -> Message:
    """Turn received frames (identity already stripped) into a checked message, or raise ProtocolError.
    Array fields are numpy views over the received frames (no copy)."""
    cls, header, arrays = _decode_header(frames)
    return cls.from_parts(header, arrays)


@dataclass
class Routed:
    """A CHUNK or RESULT as the broker handles it: the checked header and the frames as received
    (type, header, arrays), whose array frames are forwarded unread."""

    type: MsgType
    header: dict[str, Any]
    frames: list[Any]

    @property
    def chunk_id(self) -> str:
        return str(self.header["chunk_id"])

    def with_header(self, **changes: Any) -> list[Any]:
        """The frames to forward with some header fields changed: only the small header is packed again;
        the array frames are the received ones (ZeroMQ sends them without copying)."""
        header = msgpack.packb({**self.header, **changes}, use_bin_type=True)
        return [self.frames[0], header, *self.frames[2:]]


def peek(frames: list[Any]) -> Message | Routed:
    """What the broker reads of a message: CHUNK and RESULT come back as Routed, their headers checked
    and their array frames checked for byte length only; every other type (no arrays) decoded whole."""
    cls, header, arrays = _decode_header(frames)
    if cls is Chunk:
        expected = [4 * header["num_tokens"], 4 * header["num_seqs"]]
        if header.get("has_token_types"):
            expected.append(4 * header["num_tokens"])
    elif cls is Result:
        expected = result_frame_bytes(header)
    else:
        return cls.from_parts(header, arrays)
    sizes = [memoryview(a).nbytes for a in arrays]  # bytes, not elements, whatever the buffer's format
    if sizes != expected:
        raise ProtocolError(f"{cls.TYPE.name} array frames hold {sizes} bytes, its header implies {expected}")
    return Routed(cls.TYPE, header, list(frames))


def split_identity(frames: list[Any]) -> tuple[bytes, list[Any]]:
    """A ROUTER socket's message is [identity, *message]; return both parts."""
    if len(frames) < 3:
        raise ProtocolError("a routed message needs an identity frame and a message")
    identity = frames[0]
    return bytes(getattr(identity, "bytes", identity)), frames[1:]
