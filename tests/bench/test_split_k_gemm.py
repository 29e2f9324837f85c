"""The split-K GEMM that kernel_bench --gemms times against cuBLAS (bench/engine/split_k_gemm.py), on the GPU:
every candidate plan against a float32 product, the same bits on every run and in a CUDA graph's replays,
and the arrival counters back at zero after each product."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("m, n, k", [(128, 1024, 3072), (100, 4096, 1024), (512, 1000, 2048)])
def test_every_plan_matches_a_float32_product_and_repeats_itself(m: int, n: int, k: int) -> None:
    from quiver.bench.engine.split_k_gemm import SplitKGemm, candidate_plans

    torch.manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02
    reference = x.float() @ weight.float().t()
    gemm = SplitKGemm(x.device)
    plans = candidate_plans(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count)
    assert any(plan.split > 1 for plan in plans)
    for plan in plans:
        out = gemm.run(plan, x, weight)
        assert int(gemm.arrivals.abs().sum()) == 0, plan
        assert float((out.float() - reference).abs().max() / reference.abs().max()) < 0.01, plan
        assert torch.equal(out, gemm.run(plan, x, weight)), plan
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            replayed = gemm.run(plan, x, weight)
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(replayed, out), plan
