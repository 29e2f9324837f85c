"""Start-up's op-set variants that change how a model's layers run (choices.py): the residual added inside
the product before it (ElementwiseOps.residual_epilogue) against the separate add, and every variant's step
replayed from a CUDA graph against the same step run eagerly."""

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

QWEN3 = next(f for f in FAMILIES if f.name == "qwen3_bidirectional_mean")


def _long_batch(seed: int) -> Batch:
    """24 rows of 100 tokens: a step long enough for every variant to run."""
    ids = np.random.default_rng(seed).integers(4, 90, size=2400, dtype=np.int32)
    batch = Batch(input_ids=ids, seq_lens=np.full(24, 100, dtype=np.int32))
    assert batch.num_tokens >= max(fused.RESIDUAL_EPILOGUE_MIN_TOKENS, fused.SWIGLU_PRODUCT_MIN_TOKENS)
    return batch


def test_the_residual_epilogue_gives_the_separate_add_and_norm_only_where_it_applies() -> None:
    generator = torch.Generator().manual_seed(0)
    weight, norm_weight = torch.randn(32, 48, generator=generator), torch.rand(32, generator=generator) + 0.5
    separate, epilogue = fused.plain_ops(), dataclasses.replace(fused.plain_ops(), residual_epilogue=True)
    for tokens in (1, fused.RESIDUAL_EPILOGUE_MIN_TOKENS - 1, fused.RESIDUAL_EPILOGUE_MIN_TOKENS, 3000):
        x, residual = torch.randn(tokens, 48, generator=generator), torch.randn(tokens, 32, generator=generator)
        expected = fused.add_rms_norm(F.linear(x, weight), residual, norm_weight, 1e-6)
        for ops in (separate, epilogue):
            got = ops.linear_add_rms_norm(x, weight, None, residual, norm_weight, 1e-6)
            exact = ops is separate or tokens < fused.RESIDUAL_EPILOGUE_MIN_TOKENS
            for g, e in zip(got, expected):
                torch.testing.assert_close(g, e, rtol=0 if exact else 1e-5, atol=0 if exact else 1e-5)
            torch.testing.assert_close(ops.linear_add(x, weight, residual), expected[1],
                                       rtol=0 if exact else 1e-5, atol=0 if exact else 1e-5)
    # a bias, or an FP8 weight, keeps the separate units: the same bits as without the variant
    x, residual = torch.randn(3000, 48, generator=generator), torch.randn(3000, 32, generator=generator)
    bias = torch.randn(32, generator=generator)
    for args in ((weight, bias), (quantize_weight(weight), None)):
        for g, e in zip(epilogue.linear_add_rms_norm(x, *args, residual, norm_weight, 1e-6),
                        separate.linear_add_rms_norm(x, *args, residual, norm_weight, 1e-6)):
            assert torch.equal(g, e)


def test_a_qwen3_engine_with_the_residual_epilogue_gives_the_rows_it_gives_without(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = write_family(QWEN3, tmp_path)
    engine = load_engine(path)
    batch = _long_batch(5)
    without = engine.run_eager(batch)
    products_with_residual = []
    addmm = torch.addmm

    def counted_addmm(*args: torch.Tensor) -> torch.Tensor:
        products_with_residual.append(args[1].shape)
        return addmm(*args)

    monkeypatch.setattr(torch, "addmm", counted_addmm)
    engine.model.ops = dataclasses.replace(engine.model.ops, residual_epilogue=True)
    with_epilogue = engine.run_eager(batch)
    assert len(products_with_residual) == 2 * len(engine.model.layers)  # o and down of every layer
    np.testing.assert_allclose(with_epilogue, without, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["swiglu_product", "residual_epilogue"])
def test_a_step_with_the_variant_replays_from_a_graph_as_it_runs_eagerly(variant: str, tmp_path: Path) -> None:
    """A 2,400-token Qwen3 step with the variant captured in a CUDA graph, then replayed on two batches'
    inputs, against the same padded step run eagerly (the swiglu product's tensor descriptors, made at
    capture, must stay right for every replay); start-up measured the variant's agreement on this model."""
    from quiver.worker.engine.buckets import plan_shape
    from quiver.worker.engine.layers import swiglu_product

    path, _ = write_family(QWEN3, tmp_path)
    engine = load_engine(path, device="cuda", fusion="triton")
    assert engine.info.startup_detail[f"{variant}_cosine"] > 0.999
    value = swiglu_product.gate_up_silu if variant == "swiglu_product" else True
    engine.model.ops = dataclasses.replace(engine.model.ops, **{variant: value})
    batches = [_long_batch(6), _long_batch(7)]
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
