"""GELU layers' product, bias and GELU in one call (ElementwiseOps.gelu_epilogue, chosen at start-up)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from quiver.worker.engine.layers import fused


def test_without_the_epilogue_a_gelu_layer_is_its_product_then_its_activation() -> None:
    generator = torch.Generator().manual_seed(3)
    x, weight, bias = (torch.randn(*size, generator=generator) for size in ((7, 16), (32, 16), (32,)))
    ops = fused.plain_ops()
    for kind in ("gelu", "gelu_pytorch_tanh", "relu"):
        expected = fused.activation(F.linear(x, weight, bias), kind)
        torch.testing.assert_close(ops.linear_activation(x, weight, bias, kind), expected, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [2, 128, 4096, 16384])
def test_the_epilogue_is_gelus_tanh_form_of_the_product(tokens: int) -> None:
    """bf16 at BGE-M3's up projection (1024 → 4096) against float32 with the tanh GELU, and within the
    small difference of the two GELU forms from the erf GELU the checkpoint names."""
    generator = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, 1024, device="cuda", generator=generator).bfloat16()
    weight = (torch.randn(4096, 1024, device="cuda", generator=generator) * 0.03).bfloat16()
    bias = (torch.randn(4096, device="cuda", generator=generator) * 0.1).bfloat16()
    ops = dataclasses.replace(fused.plain_ops(), gelu_epilogue=True)
    got = ops.linear_activation(x, weight, bias, "gelu").float()
    product = F.linear(x.float(), weight.float(), bias.float())
    torch.testing.assert_close(got, F.gelu(product, approximate="tanh"), rtol=2e-2, atol=2e-2)
    assert (got - F.gelu(product)).abs().max().item() < 3e-2
    cosine = F.cosine_similarity(got, F.gelu(product), dim=1)
    assert cosine.min().item() > 0.9999


@pytest.mark.gpu
def test_an_engine_with_the_epilogue_matches_transformers(tmp_path: Path) -> None:
    """The whole XLM-R-style encoder with the epilogue (bf16) against transformers in float32 (erf GELU);
    start-up measured the epilogue and recorded its agreement with the separate units."""
    from quiver.worker.engine import Batch, load_engine
    from tests.worker.engine.families import FAMILIES, reference_rows, write_family

    family = next(f for f in FAMILIES if f.name == "bert_mean")
    path, model = write_family(family, tmp_path)
    engine = load_engine(path, device="cuda", fusion="triton", cuda_graphs=False)
    assert engine.info.startup_detail["gelu_epilogue_cosine"] > 0.999
    engine.model.ops = dataclasses.replace(engine.model.ops, gelu_epilogue=True)
    rng = np.random.default_rng(11)
    sequences = [rng.integers(4, 90, size=n, dtype=np.int32) for n in (5, 17, 100, 3)]
    expected = reference_rows(family, model.float(), sequences, [np.zeros_like(s) for s in sequences],
                              [False] * len(sequences))
    rows = engine.run_eager(Batch(input_ids=np.concatenate(sequences),
                                  seq_lens=np.array([len(s) for s in sequences], dtype=np.int32)))
    cosines = (rows * expected).sum(1) / (np.linalg.norm(rows, axis=1) * np.linalg.norm(expected, axis=1))
    assert cosines.min() >= 0.999, cosines
