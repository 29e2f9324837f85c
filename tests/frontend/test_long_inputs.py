"""Windowing of over-long inputs: special tokens kept around each window, token-weighted means."""

from __future__ import annotations

import numpy as np

from quiver.common.ragged import RaggedIds
from quiver.frontend.long_inputs import Windows, split_ids, weighted_mean


def test_windows_keep_special_tokens_and_cover_every_token() -> None:
    ids = [101, *range(1, 11), 102]
    special = [1] + [0] * 10 + [1]
    windows = split_ids(ids, special, limit=6)
    assert windows == [[101, 1, 2, 3, 4, 102], [101, 5, 6, 7, 8, 102], [101, 9, 10, 102]]
    assert split_ids(ids, special, limit=12) == [ids]
    assert split_ids(list(range(7)), [0] * 7, limit=3) == [[0, 1, 2], [3, 4, 5], [6]]


def test_weighted_mean_by_window_tokens() -> None:
    rows = np.array([[1.0, 0.0], [0.0, 1.0], [3.0, 4.0]], dtype=np.float32)
    windows = Windows(RaggedIds.from_lists([[1, 2, 3], [4], [5, 6]]), np.array([0, 0, 1]), 2)
    means = weighted_mean(rows, windows, normalize=False)
    np.testing.assert_allclose(means, [[0.75, 0.25], [3.0, 4.0]])
    unit = weighted_mean(rows, windows, normalize=True)
    np.testing.assert_allclose(unit[1], [0.6, 0.8], rtol=1e-6)
