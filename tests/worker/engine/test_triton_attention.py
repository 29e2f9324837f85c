"""The Triton attention kernel (triton_attention.py) against float32 attention of each row alone.

On a machine without CUDA it runs through Triton's interpreter (TRITON_INTERPRET=1, under which
tests/conftest.py imports the kernel modules) on CPU tensors in float32 and float16 (the interpreter's bf16
products are wrong), and skips where Triton is not installed; on a GPU it runs compiled in bf16 (the `gpu`
marker) at the real head shapes. Every case carries what a graph step carries: empty rows and a max_seqlen
bound above the longest row. Outputs are poisoned (NaN), so a query the kernel failed to write fails the
comparison.
"""

from __future__ import annotations

from itertools import accumulate

import pytest
import torch
import torch.nn.functional as F

ON_GPU = torch.cuda.is_available()
pytest.importorskip("triton")
from quiver.worker.engine.layers.triton_attention import (  # noqa: E402 - only where Triton is installed
    AttentionTile, tile_for, varlen_attention,
)

SMALL_TILE = AttentionTile(32, 16, 4, 2)  # a few blocks per row at the interpreter's small sizes
PAIRED_HEADS_TILE = AttentionTile(32, 16, 4, 2, heads=2)  # two query heads of one key head a program (GQA)
CPU_CASES = [  # (query heads, key heads, head width, causal)
    (4, 4, 16, False), (4, 2, 32, False), (4, 2, 32, True), (6, 2, 16, False),  # 3 heads a key head: no pairing
]
CPU_LENS = [37, 64, 5, 1, 21, 0, 70, 0]


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: list[int], causal: bool) -> torch.Tensor:
    groups = q.shape[1] // k.shape[1]
    rows, at = [], 0
    for length in lens:
        qq, kk, vv = (x[at:at + length].double().transpose(0, 1) for x in (q, k, v))
        kk, vv = kk.repeat_interleave(groups, dim=0), vv.repeat_interleave(groups, dim=0)
        rows.append(F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal).transpose(0, 1))
        at += length
    return torch.cat(rows)


def run_case(heads: int, kv_heads: int, width: int, causal: bool, lens: list[int], bound: int,
             dtype: torch.dtype, device: str, tile: AttentionTile | None) -> float:
    """The relative L2 error of the kernel on q, k, v laid out as views of one fused projection."""
    tokens = sum(lens)
    widths = [heads * width, kv_heads * width, kv_heads * width]
    generator = torch.Generator().manual_seed(tokens + heads + width)
    fused = torch.randn(tokens, sum(widths), generator=generator).to(device=device, dtype=dtype)
    q, k, v = (part.view(tokens, -1, width) for part in fused.split(widths, dim=-1))
    cu = torch.tensor([0, *accumulate(lens)], dtype=torch.int32, device=device)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True  # type: ignore[attr-defined]
    try:
        out = varlen_attention(q, k, v, cu, bound, width**-0.5, causal, tile)
    finally:
        torch.use_deterministic_algorithms(previous)
    expected = reference(q, k, v, lens, causal)
    return float((out.double() - expected).norm() / expected.norm())


@pytest.mark.skipif(ON_GPU, reason="the interpreter runs where there is no GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads,kv_heads,width,causal", CPU_CASES)
@pytest.mark.parametrize("tile", [SMALL_TILE, None, PAIRED_HEADS_TILE], ids=["small tile", "default tile", "heads paired"])
def test_the_interpreted_kernel_matches_each_row_alone(heads: int, kv_heads: int, width: int, causal: bool,
                                                       dtype: torch.dtype, tile: AttentionTile | None,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert tile is not None or tile_for(width).block_m < max(CPU_LENS)  # rows of several query blocks
    error = run_case(heads, kv_heads, width, causal, CPU_LENS, 96, dtype, "cpu", tile)
    assert error < (1e-5 if dtype == torch.float32 else 2e-3), error


GPU_LENS = [517, 1, 0, 300, 2048, 64, 0, 1000, 129, 0, 0]


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs CUDA")
@pytest.mark.parametrize("heads,kv_heads,width", [(16, 16, 64), (16, 8, 128), (12, 12, 32)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tile", [None, AttentionTile(64, 64, 4, 3, heads=2)], ids=["default tile", "heads paired"])
def test_the_compiled_kernel_matches_each_row_alone_at_real_heads(heads: int, kv_heads: int, width: int,
                                                                  causal: bool, tile: AttentionTile | None) -> None:
    for bound in (2048, 4096):
        error = run_case(heads, kv_heads, width, causal, GPU_LENS, bound, torch.bfloat16, "cuda", tile)
        assert error < 1e-2, (bound, error)


def test_only_power_of_two_head_widths_are_taken() -> None:
    q = torch.zeros(4, 2, 24)
    with pytest.raises(ValueError, match="head width 24"):
        varlen_attention(q, q, q, torch.tensor([0, 4], dtype=torch.int32), 4, 1.0, False)
