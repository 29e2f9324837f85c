"""Sparse RESULT messages (SPLADE rows as their non-zeros): round trip, and refusal of inconsistent frames."""

from __future__ import annotations

import numpy as np
import pytest

from quiver.common.protocol import ProtocolError, Result, decode


def _dense() -> np.ndarray:
    rows = np.zeros((3, 10), dtype=np.float32)
    rows[0, [1, 7]] = [0.5, 2.0]
    rows[2, [0, 9]] = [1.0, 3.5]
    return rows


def test_round_trip_keeps_rows_and_order() -> None:
    dense = Result(chunk_id="c", num_seqs=3, dim=10, values=_dense())
    sparse = dense.to_sparse()
    frames = sparse.encode()
    assert len(frames) == 5 and sum(memoryview(f).nbytes for f in frames[2:]) == (3 + 4 + 4) * 4
    decoded = decode(frames)
    assert isinstance(decoded, Result) and decoded.nnz == 4
    rows = decoded.sparse_rows()
    assert [r[0].tolist() for r in rows] == [[1, 7], [], [0, 9]]
    assert [r[1].tolist() for r in rows] == [[0.5, 2.0], [], [1.0, 3.5]]
    assert decode(dense.encode()).nnz is None  # dense results are unchanged on the wire


@pytest.mark.parametrize("counts, indices", [([2, 0, 1], [1, 7, 0, 9]), ([2, 0, 2], [1, 7, 0, 10]),
                                             ([2, -1, 3], [1, 7, 0, 9])])
def test_inconsistent_sparse_frames_are_refused(counts: list[int], indices: list[int]) -> None:
    frames = Result(chunk_id="c", num_seqs=3, dim=10, values=_dense()).to_sparse().encode()
    frames[2] = np.asarray(counts, dtype=np.int32).tobytes()
    frames[3] = np.asarray(indices, dtype=np.int32).tobytes()
    with pytest.raises(ProtocolError):
        decode(frames)
