"""Token-row RESULT messages (one row per token of a "tokens" chunk): round trip and refusals."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from quiver.common.protocol import ProtocolError, Result, decode, peek, result_frame_bytes


def _result() -> Result:
    values = np.arange(7 * 5, dtype=np.float32).reshape(7, 5)
    return Result(chunk_id="c", num_seqs=2, dim=5, num_rows=7, values=values)


def test_round_trip_keeps_every_token_row() -> None:
    frames = _result().encode()
    assert len(frames) == 3 and memoryview(frames[2]).nbytes == 7 * 5 * 4
    decoded = decode(frames)
    assert isinstance(decoded, Result) and decoded.num_rows == 7 and decoded.values.shape == (7, 5)
    np.testing.assert_array_equal(decoded.values, _result().values)
    assert result_frame_bytes(decoded.header()) == [7 * 5 * 4]
    assert "num_rows" not in Result(chunk_id="c", num_seqs=1, dim=5, values=np.zeros((1, 5))).header()


def test_the_broker_checks_the_values_frame_against_num_rows() -> None:
    frames = _result().encode()
    assert peek(frames).header["num_rows"] == 7
    with pytest.raises(ProtocolError):
        peek([*frames[:2], bytes(frames[2])[:-20]])  # one row short


@pytest.mark.parametrize("change", [dict(num_rows=0), dict(num_rows=-1), dict(num_rows="7"), dict(nnz=3)])
def test_bad_headers_are_refused(change: dict) -> None:
    frames = _result().encode()
    header = {**msgpack.unpackb(frames[1]), **change}
    with pytest.raises(ProtocolError):
        decode([frames[0], msgpack.packb(header), frames[2]])
