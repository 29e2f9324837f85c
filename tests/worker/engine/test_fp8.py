"""FP8 (`--dtype fp8`) on the CPU: the quantisation against a dequantised reference, the scaled product
against the same product in float64, FP8 models against transformers in float32, and the refusals
(a CPU worker or `quiver serve` asked for fp8 exits 2 with the reason).

torch's CPU build runs torch._scaled_mm with row-wise scales, so the FP8 models run here as they do on
a GPU; only the serving path refuses the CPU. The GPU's kernels are tested in test_gpu.py and
test_triton_ops.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from quiver.common.model_info import ModelError, default_model_dir, load_model_info
from quiver.worker.engine import Batch, load_engine
from quiver.worker.engine.engine import Engine
from quiver.worker.engine.layers.fused import plain_ops
from quiver.worker.engine.layers.linear import FP8_DTYPE, FP8_MAX, Fp8Weight, fp8_linear, quantize_rows, quantize_weight
from quiver.worker.engine.loader import build_model
from quiver.worker.engine.choices import fusion_agreement
from quiver.worker.engine.startup import DtypeUnavailable, check_fp8, float32_rows
from tests.worker.engine.families import FAMILIES, VOCAB, reference_rows, write_family

# e4m3 keeps 3 mantissa bits: a normal value rounds to within 2**-4 of itself; values below the
# smallest normal (2**-6 of the scale) to within half the subnormal step, 2**-10 of the scale.
RELATIVE_ROUNDING = 2.0**-4
SUBNORMAL_STEP = 2.0**-9


def _rows_of_spread_magnitude(rows: int, cols: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    magnitudes = torch.logspace(-3, 2, rows).unsqueeze(1)
    return torch.randn(rows, cols, generator=generator) * magnitudes


def test_weights_take_one_scale_per_output_channel() -> None:
    weight = _rows_of_spread_magnitude(48, 64, seed=0)
    quantized = quantize_weight(weight)
    assert isinstance(quantized, Fp8Weight)
    assert quantized.data.dtype == FP8_DTYPE and quantized.data.shape == (48, 64)
    assert quantized.scale.dtype == torch.float32 and quantized.scale.shape == (1, 48)
    torch.testing.assert_close(quantized.scale[0], weight.abs().amax(1) / FP8_MAX)
    assert torch.equal(quantized.data.float().abs().amax(1), torch.full((48,), FP8_MAX))  # each row uses the range
    error = (quantized.dequantized() - weight).abs()
    allowed = weight.abs() * RELATIVE_ROUNDING + quantized.scale.t() * SUBNORMAL_STEP
    assert bool((error <= allowed).all()), float((error - allowed).max())


def test_weights_scaled_mm_cannot_take_stay_as_they_are() -> None:
    weight = torch.randn(40, 24)  # 24 is not a multiple of 16
    assert quantize_weight(weight) is weight


def test_activations_take_one_scale_per_token() -> None:
    x = _rows_of_spread_magnitude(37, 96, seed=1).to(torch.bfloat16)
    data, scale = quantize_rows(x)
    assert data.dtype == FP8_DTYPE and scale.shape == (37, 1)
    torch.testing.assert_close(scale[:, 0], x.float().abs().amax(1) / FP8_MAX)
    error = (data.float() * scale - x.float()).abs()
    assert bool((error <= x.float().abs() * RELATIVE_ROUNDING + scale * SUBNORMAL_STEP).all())
    zeros, zero_scale = quantize_rows(torch.zeros(2, 32))
    assert torch.equal(zeros.float(), torch.zeros(2, 32)) and bool((zero_scale > 0).all())


@pytest.mark.parametrize("with_bias", [True, False])
def test_the_scaled_product_is_the_dequantised_product(with_bias: bool) -> None:
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(37, 64, generator=generator).to(torch.bfloat16)
    weight = torch.randn(48, 64, generator=generator) * 0.05
    bias = torch.randn(48, generator=generator).to(torch.bfloat16) if with_bias else None
    quantized = quantize_weight(weight)
    assert isinstance(quantized, Fp8Weight)
    out = fp8_linear(x, quantized, bias, quantize_rows)
    assert out.dtype == torch.bfloat16 and out.shape == (37, 48)

    data, scale = quantize_rows(x)
    expected = (data.double() * scale.double()) @ quantized.dequantized(torch.float64).t()
    if bias is not None:
        expected += bias.double()
    torch.testing.assert_close(out.double(), expected, rtol=1e-2, atol=1e-2)  # bf16 output rounding
    exact = x.double() @ weight.double().t() + (bias.double() if bias is not None else 0)
    relative = float((out.double() - exact).norm() / exact.norm())
    assert relative < 0.05, relative  # what e4m3 on both operands costs, no more


@pytest.mark.parametrize("family_name", ["qwen3_bidirectional_mean", "xlmr_cls", "bert_mean"])
def test_fp8_models_agree_with_transformers_in_float32(family_name: str, tmp_path: Path) -> None:
    family = next(f for f in FAMILIES if f.name == family_name)
    path, reference_model = write_family(family, tmp_path)
    info = load_model_info(path)
    with torch.inference_mode():
        model = build_model(info, torch.device("cpu"), torch.float32, plain_ops(), fp8_weights=True)
    layer = model.layers[0]  # type: ignore[attr-defined]
    assert all(isinstance(getattr(layer, name), Fp8Weight) for name in layer.LINEAR_WEIGHTS)
    engine = Engine(model, info, torch.device("cpu"), torch.float32, 1024, 16, cuda_graphs=False)

    rng = np.random.default_rng(5)
    sequences = [rng.integers(4, VOCAB, size=n, dtype=np.int32) for n in (100, 7, 33)]
    types = [np.zeros(len(s), dtype=np.int32) for s in sequences]
    expected = reference_rows(family, reference_model, sequences, types, [True] * 3)
    rows = engine.run_eager(Batch(input_ids=np.concatenate(sequences), seq_lens=np.array([100, 7, 33], np.int32),
                                  normalize=np.ones(3, dtype=bool)))
    cosines = (rows * expected).sum(1) / (np.linalg.norm(rows, axis=1) * np.linalg.norm(expected, axis=1))
    print(f"{family_name}: fp8 weights vs float32 transformers, cosines {np.round(cosines, 5).tolist()}")
    assert cosines.min() >= 0.98
    assert cosines.min() < 1 - 1e-7  # the weights really are quantised


def test_the_start_up_check_measures_a_real_model_and_refuses_below_its_threshold() -> None:
    """The packaged all-MiniLM-L6-v2 (trained weights) in FP8 against its float32 self on the start-up
    probe: the check returns the cosine it measured, and raises a ModelError that says what to do when
    the threshold is above it."""
    info = load_model_info(default_model_dir())
    reference = float32_rows(info, torch.device("cpu"), 2048, 16)
    with torch.inference_mode():
        model = build_model(info, torch.device("cpu"), torch.float32, plain_ops(), fp8_weights=True)
    engine = Engine(model, info, torch.device("cpu"), torch.float32, 2048, 16, cuda_graphs=False)
    cosine = check_fp8(engine, reference, 0.98)
    print(f"all-MiniLM-L6-v2 in FP8: least cosine {cosine} against float32 on the start-up probe")
    assert 0.98 <= cosine < 1 - 1e-7
    with pytest.raises(ModelError, match=r"cannot be served in FP8: .* cosine of only .* --dtype bfloat16"):
        check_fp8(engine, reference, min(1.0, cosine + 1e-4))


def test_load_engine_refuses_fp8_on_a_cpu(tmp_path: Path) -> None:
    path, _ = write_family(FAMILIES[0], tmp_path)
    with pytest.raises(DtypeUnavailable, match="compute capability 9.0"):
        load_engine(path, device="cpu", dtype="fp8")


def _quiver(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QUIVER_LOG_LEVEL": "INFO"}
    return subprocess.run([sys.executable, "-m", "quiver", *args], capture_output=True, text=True, timeout=300,
                          env=env)


def test_a_cpu_worker_asked_for_fp8_exits_2_with_the_reason() -> None:
    done = _quiver("worker", "--device", "cpu", "--dtype", "fp8", "--broker", "tcp://127.0.0.1:1")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--dtype fp8 needs" in done.stderr


def test_serve_on_a_cpu_asked_for_fp8_exits_2_with_the_reason() -> None:
    done = _quiver("serve", "--device", "cpu", "--dtype", "fp8")
    assert done.returncode == 2, done.stderr[-2000:]
    assert "--dtype fp8 needs" in done.stderr


def test_fused_sets_of_an_fp8_engine_are_held_to_fp8s_own_divergence() -> None:
    assert fusion_agreement(None) == 0.999  # bf16 / float32 engines: as before
    assert fusion_agreement(0.9999) == 0.999  # never looser than that
    assert fusion_agreement(0.99) == pytest.approx(0.98)
