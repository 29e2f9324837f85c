"""The tile benchmark's candidates (CPU) and one short run of it (GPU)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")
from quiver.bench.engine import tile_bench
from quiver.bench.engine.kernel_bench import BGE_M3, PPLX


@pytest.mark.parametrize(("unit", "shape"), [("qk_norm_rope", PPLX), ("add_rms_norm", PPLX),
                                             ("add_layer_norm", BGE_M3)])
def test_candidates_are_valid_launches_and_include_the_first(unit: str, shape: object) -> None:
    found = tile_bench.candidates(unit, shape)
    assert len(found) >= 10
    launches = [kwargs for _, kwargs in found]
    assert tile_bench.first_launch(unit, shape) in launches
    for kwargs in launches:
        if unit == "qk_norm_rope":
            elements, warps = kwargs["heads_per_program"] * PPLX.head_dim, kwargs["warps"]
        else:
            elements, warps = kwargs["tile"].rows * shape.hidden, kwargs["tile"].warps  # type: ignore[attr-defined]
        assert 2 <= elements // (32 * warps) <= 64


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_short_run_keeps_every_candidate_and_finds_one_no_slower_than_the_default() -> None:
    rows = tile_bench.bench_tiles([256], tile_bench.copy_bandwidth_gbs())
    assert [row["unit"] for row in rows] == [label for label, _ in tile_bench.UNITS]
    for row in rows:
        assert row["left_out"] == []
        assert 0 < row["best_us"] <= row["default_us"] * 1.05 and row["bound_us"] > 0
