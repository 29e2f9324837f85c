"""The wire protocol: every message survives encode/decode, and malformed frames are refused."""

from __future__ import annotations

import pickle

import msgpack
import numpy as np
import pytest

from quiver.common.protocol import (
    MAX_HEADER_BYTES, PRIORITY_BACKGROUND, PRIORITY_ONLINE, PROTOCOL_VERSION, Cancel, Chunk, Disconnect, Error, Heartbeat,
    MsgType, ProtocolError, Ready, Reconnect, Result, decode, split_identity,
)


def roundtrip(message):
    return decode([bytes(f) for f in message.encode()])


def make_chunk(**overrides) -> Chunk:
    fields = dict(chunk_id="f:1", task="embed", num_seqs=3, num_tokens=6, normalize=True, timeout_s=5.0,
                  input_ids=np.array([101, 7, 102, 101, 8, 102], dtype=np.int32),
                  seq_lens=np.array([3, 2, 1], dtype=np.int32))
    fields.update(overrides)
    return Chunk(**fields)


def test_every_message_roundtrips():
    messages = [
        Ready(version=PROTOCOL_VERSION, name="cuda:0", model="m", device="cuda:0", capacity_tokens=8192, output_dim=1024,
              fingerprint="abc", secret="s", tasks=["embed"], pid=42),
        Heartbeat(live_workers=2, draining=True, broker_id="b1", fingerprint="f"),
        Disconnect(reason="bye"),
        Reconnect(),
        Cancel(chunk_id="f:9"),
        Error(chunk_id="f:1", code="internal", message="boom", worker="cpu-0"),
    ]
    for message in messages:
        assert roundtrip(message) == message


def test_chunk_and_result_arrays_travel_as_raw_frames():
    chunk = make_chunk(has_token_types=True, token_type_ids=np.array([0, 0, 0, 1, 1, 1], dtype=np.int32))
    frames = chunk.encode()
    assert len(frames) == 5 and bytes(frames[0]) == bytes([MsgType.CHUNK])
    assert bytes(frames[2]) == chunk.input_ids.astype("<i4").tobytes()
    back = roundtrip(chunk)
    np.testing.assert_array_equal(back.input_ids, chunk.input_ids)
    np.testing.assert_array_equal(back.seq_lens, chunk.seq_lens)
    np.testing.assert_array_equal(back.token_type_ids, chunk.token_type_ids)

    values = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    result = roundtrip(Result(chunk_id="f:1", num_seqs=3, dim=4, queue_s=0.1, inference_s=0.2, worker="w", values=values))
    np.testing.assert_array_equal(result.values, values)
    assert result.values.dtype == np.float32


@pytest.mark.parametrize("frames,words", [
    ([b"\x03"], "needs a type frame"),
    ([b"\x63", msgpack.packb({})], "unknown message type"),
    ([b"\x02\x02", msgpack.packb({})], "one byte"),
    ([b"\x02", b"\xc1"], "msgpack"),
    ([b"\x02", msgpack.packb([1, 2])], "must be a map"),
    ([b"\x02", msgpack.packb({"live_workers": -1})], "live_workers"),
    ([b"\x02", msgpack.packb({"surprise": 1})], "unknown fields"),
    ([b"\x05", msgpack.packb({"chunk_id": "x", "code": "nope", "message": "m"})], "code"),
    ([b"\x05", msgpack.packb({"chunk_id": "x", "code": ["internal"], "message": "m"})], "code"),
    ([b"\x04", msgpack.packb({"chunk_id": "x", "num_seqs": 1, "dim": 2, "dtype": [1]}), b"\x00" * 8], "dtype"),
    ([b"\x04", msgpack.packb({"chunk_id": "x", "num_seqs": 1, "dim": 2, "dtype": {"a": 1}}), b"\x00" * 8], "dtype"),
    ([b"\x02", b"\x80" + b" " * (MAX_HEADER_BYTES + 1)], "limit"),
    ([b"\x02", pickle.dumps({"live_workers": 1})], "msgpack"),
])
def test_malformed_messages_are_refused(frames, words):
    with pytest.raises(ProtocolError, match=words):
        decode(frames)


def test_chunk_frames_must_match_the_header():
    frames = [bytes(f) for f in make_chunk().encode()]
    with pytest.raises(ProtocolError, match="bytes"):
        decode(frames[:2] + [frames[2][:-4], frames[3]])
    with pytest.raises(ProtocolError, match="array frames"):
        decode(frames[:3])
    bad_lens = np.array([3, 2, 2], dtype=np.int32).tobytes()
    with pytest.raises(ProtocolError, match="sum to num_tokens"):
        decode(frames[:3] + [bad_lens])
    header = msgpack.unpackb(frames[1])
    header["input_ids"] = [1, 2]
    with pytest.raises(ProtocolError):
        decode([frames[0], msgpack.packb(header), *frames[2:]])


def test_header_field_types_are_checked():
    frames = [bytes(f) for f in make_chunk().encode()]
    for field, value in (("task", "dance"), ("num_seqs", "3"), ("normalize", 1), ("timeout_s", -1.0)):
        header = msgpack.unpackb(frames[1])
        header[field] = value
        with pytest.raises(ProtocolError, match=field):
            decode([frames[0], msgpack.packb(header), *frames[2:]])


def test_chunks_and_heartbeats_name_models():
    assert roundtrip(make_chunk(model="0123abcd")).model == "0123abcd"
    assert roundtrip(make_chunk()).model == ""  # no model: any worker
    beat = Heartbeat(models={"aa": "minilm", "bb": "reranker"}, workers_by_model={"aa": 2, "bb": 0})
    assert roundtrip(beat) == beat
    frames = [bytes(f) for f in Heartbeat().encode()]
    for field, value in (("models", ["aa"]), ("models", {"aa": 3}), ("workers_by_model", {"aa": -1}),
                         ("workers_by_model", {"x" * 200: 1})):
        with pytest.raises(ProtocolError, match=field):
            decode([frames[0], msgpack.packb({field: value}), *frames[2:]])
    chunk_frames = [bytes(f) for f in make_chunk().encode()]
    header = msgpack.unpackb(chunk_frames[1])
    header["model"] = 7
    with pytest.raises(ProtocolError, match="model"):
        decode([chunk_frames[0], msgpack.packb(header), *chunk_frames[2:]])


def test_split_identity():
    identity, rest = split_identity([b"peer", b"\x02", msgpack.packb({})])
    assert identity == b"peer" and len(rest) == 2
    with pytest.raises(ProtocolError):
        split_identity([b"peer"])


def test_peek_checks_headers_and_frame_lengths_without_reading_arrays():
    from quiver.common.protocol import Routed, peek

    frames = [bytes(f) for f in make_chunk().encode()]
    routed = peek(frames)
    assert isinstance(routed, Routed) and routed.chunk_id == "f:1" and routed.header["num_tokens"] == 6
    forwarded = routed.with_header(timeout_s=1.5, attempt=2)
    assert forwarded[2] is frames[2] and forwarded[3] is frames[3]  # array frames travel untouched
    again = decode(forwarded)
    assert again.timeout_s == 1.5 and again.attempt == 2
    np.testing.assert_array_equal(again.input_ids, make_chunk().input_ids)
    with pytest.raises(ProtocolError, match="implies"):
        peek([*frames[:2], frames[2][:-4], frames[3]])
    result = Result(chunk_id="r", num_seqs=2, dim=3, dtype="float16", values=np.ones((2, 3), dtype=np.float16))
    result_frames = [bytes(f) for f in result.encode()]
    assert len(result_frames[2]) == 2 * 3 * 2
    assert peek(result_frames).frames[2] is result_frames[2]
    with pytest.raises(ProtocolError, match="implies"):
        peek([*result_frames[:2], result_frames[2] + b"\0\0"])
    assert isinstance(peek([bytes(f) for f in Cancel(chunk_id="x").encode()]), Cancel)


def test_a_chunk_carries_its_priority_and_an_online_header_is_unchanged():
    online = make_chunk()
    assert "priority" not in msgpack.unpackb(bytes(online.encode()[1]))  # as before priorities existed
    assert roundtrip(online).priority == PRIORITY_ONLINE
    background = roundtrip(make_chunk(priority=PRIORITY_BACKGROUND))
    assert background.priority == PRIORITY_BACKGROUND
    frames = [bytes(f) for f in online.encode()]
    for value in (2, -1, True, "background"):
        header = msgpack.unpackb(frames[1])
        header["priority"] = value
        with pytest.raises(ProtocolError, match="priority"):
            decode([frames[0], msgpack.packb(header), *frames[2:]])
