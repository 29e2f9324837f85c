"""The attention tile benchmark: its tiles (CPU) and one case of it (GPU)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
from quiver.bench.engine import attention_tiles
from quiver.worker.engine.layers.attention import AttentionSpec
from quiver.worker.engine.layers.triton_attention import tile_for


def test_both_tile_lists_start_with_the_default_and_hold_no_tile_twice() -> None:
    for tiles in (attention_tiles.TILES, attention_tiles.NEAR_DEFAULT_TILES):
        assert tiles[0] == tile_for(64) == tile_for(128)
        assert len(set(tiles)) == len(tiles)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_one_ragged_case_times_every_backend_and_each_tile_matches_float32() -> None:
    spec = AttentionSpec(*attention_tiles.HEAD_SHAPES["qwen3"], causal=False)
    row = attention_tiles._case(spec, "3 ragged rows", [300, 17, 512], 8, 2048, attention_tiles.NEAR_DEFAULT_TILES[:3])
    assert row["flash2_ms"] > 0 and "cudnn_dense_ms" not in row  # rows of different lengths: no dense case
    tiles = [value for key, value in row.items() if "/w" in key]
    assert len(tiles) == 3
    for tile in tiles:
        assert tile["ms"] > 0 and tile["error"] < 1e-2, tile
