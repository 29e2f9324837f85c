"""A SwiGLU layer's gate/up product and SwiGLU in one Triton kernel (layers/swiglu_product.py), against the
separate units it replaces; and the op set's choice between them (fused.ElementwiseOps.linear_silu_mul)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from quiver.worker.engine import Batch, load_engine
from quiver.worker.engine.layers import fused
from quiver.worker.engine.layers.linear import quantize_weight
from tests.worker.engine.families import FAMILIES, write_family


def _separate(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return fused.silu_mul(F.linear(x, weight))


def test_the_op_set_runs_the_one_kernel_only_from_its_token_count_and_never_on_an_fp8_weight() -> None:
    calls: list[int] = []

    def one_kernel(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return _separate(x, weight)

    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(128, 32, generator=generator)
    plain, with_kernel = fused.plain_ops(), dataclasses.replace(fused.plain_ops(), swiglu_product=one_kernel)
    for tokens in (1, fused.SWIGLU_PRODUCT_MIN_TOKENS - 1, fused.SWIGLU_PRODUCT_MIN_TOKENS, 3000):
        x = torch.randn(tokens, 32, generator=generator)
        torch.testing.assert_close(plain.linear_silu_mul(x, weight), _separate(x, weight), rtol=0, atol=0)
        torch.testing.assert_close(with_kernel.linear_silu_mul(x, weight), _separate(x, weight), rtol=0, atol=0)
    assert calls == [fused.SWIGLU_PRODUCT_MIN_TOKENS, 3000]
    fp8 = quantize_weight(weight)
    assert not isinstance(fp8, torch.Tensor)
    x = torch.randn(3000, 32, generator=generator)
    expected = plain.silu_mul(plain.linear(x, fp8))
    torch.testing.assert_close(with_kernel.linear_silu_mul(x, fp8), expected, rtol=0, atol=0)
    assert calls == [fused.SWIGLU_PRODUCT_MIN_TOKENS, 3000]


@pytest.mark.gpu
@pytest.mark.parametrize("k, inter", [(1024, 3072), (32, 64), (1000, 192)])
@pytest.mark.parametrize("tokens", [1, 100, 1024, 4096, 16384 + 37])
def test_one_kernel_gives_the_separate_units_rows(k: int, inter: int, tokens: int) -> None:
    """bf16 at Qwen3-0.6B's shape and two others (inner size below one block, and not a multiple of it),
    every row count including a partial last block; against the engine's separate units (cuBLAS, then the
    Triton SwiGLU) and float32. Outputs start as NaN, so a row the kernel failed to write fails."""
    from quiver.worker.engine.layers import swiglu_product, triton_ops

    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True  # type: ignore[attr-defined]
    try:
        generator = torch.Generator(device="cuda").manual_seed(tokens + k)
        x = torch.randn(tokens, k, device="cuda", generator=generator).bfloat16()
        weight = (torch.randn(2 * inter, k, device="cuda", generator=generator) * k ** -0.5).bfloat16()
        assert swiglu_product.unsupported_reason(weight) == ""
        got = swiglu_product.gate_up_silu(x, weight)
        separate = triton_ops.silu_mul(F.linear(x, weight))
    finally:
        torch.use_deterministic_algorithms(previous)
    assert got.shape == (tokens, inter) and torch.isfinite(got).all()
    torch.testing.assert_close(got, separate, rtol=1.6e-2, atol=1e-2)
    reference = _separate(x.float(), weight.float())
    torch.testing.assert_close(got.float(), reference, rtol=2e-2, atol=2e-2)
    differing = (got != separate).float().mean().item()
    print(f"{tokens} x {k} -> {inter}: {differing:.2%} of elements differ from the separate units'")


@pytest.mark.gpu
def test_weights_the_kernel_cannot_take_are_named() -> None:
    from quiver.worker.engine.layers import swiglu_product

    assert "multiple of 64" in swiglu_product.unsupported_reason(torch.zeros(2 * 96, 64, device="cuda",
                                                                             dtype=torch.bfloat16))
    assert "float32" in swiglu_product.unsupported_reason(torch.zeros(128, 64, device="cuda"))
    column_major = torch.zeros(64, 2048, device="cuda", dtype=torch.bfloat16).t()
    with pytest.raises(ValueError, match="cannot take"):
        swiglu_product.gate_up_silu(column_major, torch.zeros(128, 64, device="cuda", dtype=torch.bfloat16))


@pytest.mark.gpu
def test_a_qwen3_engine_with_the_one_kernel_gives_the_rows_it_gives_without(tmp_path: Path) -> None:
    """A whole Qwen3 step of 2,400 tokens (the kernel runs) with and without it, eagerly; start-up measured
    the kernel's agreement on this model."""
    from quiver.worker.engine.layers import swiglu_product

    family = next(f for f in FAMILIES if f.name == "qwen3_bidirectional_mean")
    path, _ = write_family(family, tmp_path)
    engine = load_engine(path, device="cuda", fusion="triton", cuda_graphs=False)
    assert engine.info.startup_detail["swiglu_product_cosine"] > 0.999
    rng = np.random.default_rng(5)
    sequences = [rng.integers(4, 90, size=100, dtype=np.int32) for _ in range(24)]
    batch = Batch(input_ids=np.concatenate(sequences), seq_lens=np.full(24, 100, dtype=np.int32))
    assert batch.num_tokens >= fused.SWIGLU_PRODUCT_MIN_TOKENS
    ops = engine.model.ops
    engine.model.ops = dataclasses.replace(ops, swiglu_product=None)
    without = engine.run_eager(batch)
    engine.model.ops = dataclasses.replace(ops, swiglu_product=swiglu_product.gate_up_silu)
    with_kernel = engine.run_eager(batch)
    cosines = np.sum(without * with_kernel, 1) / (np.linalg.norm(without, axis=1) * np.linalg.norm(with_kernel, axis=1))
    assert cosines.min() > 0.9999, cosines


@pytest.mark.gpu
def test_a_step_with_the_one_kernel_replays_from_a_graph_as_it_runs_eagerly(tmp_path: Path) -> None:
    """A 2,400-token Qwen3 step with the one kernel captured in a CUDA graph, then replayed on two batches'
    inputs, against the same padded step run eagerly: the kernel's tensor descriptors, made at capture, must
    stay right for every replay. Start-up measured the kernel's agreement on this model."""
    from quiver.worker.engine.buckets import plan_shape
    from quiver.worker.engine.layers import swiglu_product

    family = next(f for f in FAMILIES if f.name == "qwen3_bidirectional_mean")
    path, _ = write_family(family, tmp_path)
    engine = load_engine(path, device="cuda", fusion="triton")
    assert engine.info.startup_detail["swiglu_product_cosine"] > 0.999
    engine.model.ops = dataclasses.replace(engine.model.ops, swiglu_product=swiglu_product.gate_up_silu)
    batches = []
    for seed in (6, 7):  # 24 rows of 100 tokens: at least SWIGLU_PRODUCT_MIN_TOKENS
        ids = np.random.default_rng(seed).integers(4, 90, size=2400, dtype=np.int32)
        batches.append(Batch(input_ids=ids, seq_lens=np.full(24, 100, dtype=np.int32)))
    assert batches[0].num_tokens >= fused.SWIGLU_PRODUCT_MIN_TOKENS
    shape = plan_shape(batches[0].seq_lens, engine.graph_limits)
    assert shape.graphable
    with torch.inference_mode(), torch.cuda.stream(engine.stream):
        tensors = engine.upload(batches[0], shape)
        engine.forward_step(shape, tensors)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            output = engine.forward_step(shape, tensors)
        for batch in batches:
            eager = engine.forward_step(shape, engine.upload(batch, shape)).clone()
            engine.upload(batch, shape)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(output, eager)
