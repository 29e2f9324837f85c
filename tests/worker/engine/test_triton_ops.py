"""The Triton kernels against the plain PyTorch units they replace (fused.py), element by element.

On a machine without CUDA they run through Triton's interpreter (TRITON_INTERPRET=1, under which
tests/conftest.py imports the kernel modules) on CPU tensors, and skip where Triton is not installed; on a GPU they run compiled
(the `gpu` marker), at the real shapes and token counts up to 16384. Outputs are poisoned: with
deterministic algorithms on, torch.empty fills new float tensors with NaN, so an element a kernel failed
to write fails the comparison.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from quiver.worker.engine.layers import fused

ON_GPU = torch.cuda.is_available()
pytest.importorskip("triton")
from quiver.worker.engine.layers import triton_ops  # noqa: E402 - only where Triton is installed

# The interpreter computes sigmoid(x) = 1 / (1 + exp(-x)) in numpy, which warns where exp overflows to
# inf for very negative x; the result there is the right 0.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(ON_GPU, reason="the interpreter runs where there is no GPU")),
    pytest.param("cuda", marks=pytest.mark.gpu),
]
DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture
def poisoned_outputs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if not ON_GPU:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True  # type: ignore[attr-defined]
    yield
    torch.use_deterministic_algorithms(previous)


def _token_counts(device: str) -> list[int]:
    return [1, 37] if device == "cpu" else [1, 37, 4096, 16384]


def _assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Every element written and equal up to rounding: bf16 results may differ by one unit in the last
    place where float32 sums taken in another order round the other way (on a GPU, rarely)."""
    assert actual.shape == expected.shape and actual.dtype == expected.dtype
    assert bool(torch.isfinite(actual).all()), "an output element was not written"
    if actual.dtype == torch.float32:
        torch.testing.assert_close(actual, expected, rtol=2e-5, atol=2e-5)
    elif actual.is_cuda:
        scale = expected.float().abs().max().item()
        torch.testing.assert_close(actual.float(), expected.float(), rtol=2**-7, atol=2**-7 * scale)
        mismatched = (actual != expected).float().mean().item()
        assert mismatched < 0.02, f"{mismatched:.2%} of elements differ from the reference"
    else:
        # The interpreter truncates to bf16 instead of rounding to nearest: each rounding step in a
        # kernel may land one unit lower, and they compound (three units seen in silu * up).
        scale = expected.float().abs().max().item()
        torch.testing.assert_close(actual.float(), expected.float(), rtol=2**-5, atol=2**-5 * scale)


def _randn(generator: torch.Generator, *shape: int, dtype: torch.dtype, device: str, scale: float = 1.0):
    return (torch.randn(*shape, generator=generator) * scale).to(device=device, dtype=dtype)


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [384, 1024])
def test_add_rms_norm_and_rms_norm(device: str, dtype: torch.dtype, hidden: int) -> None:
    generator = torch.Generator().manual_seed(hidden)
    for tokens in _token_counts(device):
        x = _randn(generator, tokens, hidden, dtype=dtype, device=device, scale=3.0)
        residual = _randn(generator, tokens, hidden, dtype=dtype, device=device)
        weight = _randn(generator, hidden, dtype=dtype, device=device)
        normed, summed = triton_ops.add_rms_norm(x, residual, weight, 1e-6)
        expected_normed, expected_summed = fused.add_rms_norm(x, residual, weight, 1e-6)
        _assert_close(summed, expected_summed)
        _assert_close(normed, expected_normed)
        _assert_close(triton_ops.rms_norm(x, weight, 1e-6), fused.rms_norm(x, weight, 1e-6))


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "kv_heads", "head_dim"), [(16, 8, 128), (4, 2, 64), (3, 1, 32)])
def test_qk_norm_rope(device: str, dtype: torch.dtype, heads: int, kv_heads: int, head_dim: int) -> None:
    from quiver.worker.engine.layers.rotary import rotary_tables

    generator = torch.Generator().manual_seed(heads * head_dim)
    cos_table, sin_table = rotary_tables(head_dim, 32768, 1_000_000.0, torch.device(device))
    width = (heads + 2 * kv_heads) * head_dim
    for tokens in _token_counts(device):
        qkv = _randn(generator, tokens, width, dtype=dtype, device=device, scale=2.0)
        weight = _randn(generator, heads + kv_heads, head_dim, dtype=dtype, device=device)
        positions = torch.randint(0, 32768, (tokens,), generator=generator, dtype=torch.int32).to(device)
        args = (qkv, weight, cos_table, sin_table, positions, heads, kv_heads, 1e-6)
        for actual, expected in zip(triton_ops.qk_norm_rope(*args), fused.qk_norm_rope(*args)):
            _assert_close(actual, expected)


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("intermediate", [1536, 3072, 1000])
def test_silu_mul(device: str, dtype: torch.dtype, intermediate: int) -> None:
    generator = torch.Generator().manual_seed(intermediate)
    for tokens in _token_counts(device):
        gate_up = _randn(generator, tokens, 2 * intermediate, dtype=dtype, device=device, scale=3.0)
        _assert_close(triton_ops.silu_mul(gate_up), fused.silu_mul(gate_up))


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["gelu", "gelu_new", "relu", "silu"])
@pytest.mark.parametrize("intermediate", [1536, 4096])
def test_bias_activation(device: str, dtype: torch.dtype, kind: str, intermediate: int) -> None:
    generator = torch.Generator().manual_seed(intermediate + len(kind))
    for tokens in _token_counts(device):
        x = _randn(generator, tokens, intermediate, dtype=dtype, device=device, scale=3.0)
        bias = _randn(generator, intermediate, dtype=dtype, device=device)
        _assert_close(triton_ops.bias_activation(x, bias, kind), fused.activation(x + bias, kind))
        _assert_close(triton_ops.activation(x, kind), fused.activation(x, kind))


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [384, 1024])
def test_add_layer_norm(device: str, dtype: torch.dtype, hidden: int) -> None:
    generator = torch.Generator().manual_seed(hidden + 1)
    for tokens in _token_counts(device):
        x = _randn(generator, tokens, hidden, dtype=dtype, device=device, scale=3.0)
        residual = _randn(generator, tokens, hidden, dtype=dtype, device=device) + 0.5
        weight = _randn(generator, hidden, dtype=dtype, device=device)
        bias = _randn(generator, hidden, dtype=dtype, device=device)
        expected = fused.add_layer_norm(x, residual, weight, bias, 1e-12)
        _assert_close(triton_ops.add_layer_norm(x, residual, weight, bias, 1e-12), expected)


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("device", DEVICES)
def test_strided_inputs(device: str) -> None:
    """Row-strided views (a slice of a wider matrix) and column-strided ones (a transpose)."""
    generator = torch.Generator().manual_seed(7)
    wide = _randn(generator, 9, 96, dtype=torch.float32, device=device)
    weight = _randn(generator, 64, dtype=torch.float32, device=device)
    bias = _randn(generator, 64, dtype=torch.float32, device=device)
    for x in (wide[:, 16:80], wide[:, :64].t().contiguous().t()):
        _assert_close(triton_ops.rms_norm(x, weight, 1e-6), fused.rms_norm(x, weight, 1e-6))
        residual = torch.ones_like(x)
        for actual, expected in zip(triton_ops.add_rms_norm(x, residual, weight, 1e-6),
                                    fused.add_rms_norm(x, residual, weight, 1e-6)):
            _assert_close(actual, expected)
        _assert_close(triton_ops.bias_activation(x, bias, "gelu"), fused.activation(x + bias, "gelu"))
        _assert_close(triton_ops.add_layer_norm(x, residual, weight, bias, 1e-5),
                      fused.add_layer_norm(x, residual, weight, bias, 1e-5))


def test_unsupported_activation_is_refused() -> None:
    x = torch.ones(2, 8)
    with pytest.raises(NotImplementedError, match="not supported"):
        triton_ops.bias_activation(x, None, "mish")


@pytest.mark.gpu
@pytest.mark.parametrize("family_name", ["qwen3_bidirectional_mean", "bert_mean"])
def test_engine_with_triton_units_matches_transformers(family_name: str, tmp_path: Path) -> None:
    """The whole engine on the Triton set (bf16, graph replays) against transformers in float32."""
    from quiver.worker.engine import Batch, load_engine
    from tests.worker.engine.families import FAMILIES, reference_rows, write_family

    family = next(f for f in FAMILIES if f.name == family_name)
    path, model = write_family(family, tmp_path)
    engine = load_engine(path, device="cuda", fusion="triton")
    assert engine.info.fusion == "triton"
    rng = np.random.default_rng(5)
    sequences = [rng.integers(4, 90, size=n, dtype=np.int32) for n in (5, 17, 100, 3)]
    types = [np.zeros_like(s) for s in sequences]
    expected = reference_rows(family, model.float(), sequences, types, [False] * len(sequences))
    batch = Batch(
        input_ids=np.concatenate(sequences), seq_lens=np.array([len(s) for s in sequences], dtype=np.int32)
    )
    captured = engine.stats()["captures"]
    for _ in range(3):  # every step replays a graph captured at start-up
        lazy = engine.step(batch)
        rows = lazy.wait().copy()
        lazy.release()
        cosines = (rows * expected).sum(1) / (np.linalg.norm(rows, axis=1) * np.linalg.norm(expected, axis=1))
        assert cosines.min() >= 0.999, cosines
    assert engine.stats()["replays"] == 3 and engine.stats()["captures"] == captured


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("width", [1024, 3072, 96])
def test_quantize_rows(device: str, width: int) -> None:
    """FP8 activation quantisation: the same per-token scales as linear.quantize_rows, and on the GPU the
    same e4m3 values (the interpreter's float8 conversion does not round to nearest, so on the CPU only
    the scales and the rows' largest values are compared)."""
    from quiver.worker.engine.layers import linear

    generator = torch.Generator().manual_seed(width)
    for tokens in _token_counts(device):
        x = _randn(generator, tokens, width, dtype=torch.bfloat16, device=device, scale=3.0)
        data, scale = triton_ops.quantize_rows(x)
        expected_data, expected_scale = linear.quantize_rows(x)
        assert data.dtype == linear.FP8_DTYPE and data.shape == x.shape and scale.shape == (tokens, 1)
        torch.testing.assert_close(scale, expected_scale, rtol=0, atol=0)
        if device == "cuda":
            # Values at a rounding boundary may land one e4m3 step apart if the division rounds
            # differently; anything more, or more than a rare few, is a fault.
            actual, expected = data.float(), expected_data.float()
            step = torch.exp2(torch.floor(torch.log2(expected.abs().clamp(min=2.0**-6))) - 3)
            assert bool(((actual - expected).abs() <= step).all())
            assert (actual != expected).float().mean().item() < 1e-3
        else:
            torch.testing.assert_close(data.float().abs().amax(1), expected_data.float().abs().amax(1))


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tile", [triton_ops.Tile(1, 1), triton_ops.Tile(4, 2), triton_ops.Tile(64, 8)])
def test_every_tile_gives_the_same_rows(device: str, tile: triton_ops.Tile) -> None:
    """A launch's rows, heads and warps per program change nothing but speed, also where the token count is
    not a multiple of the rows per program, or is smaller than it, and where the heads are not a multiple of
    a program's (9 in groups of 2, 8 and 16). The benchmark's candidates rely on it."""
    from quiver.worker.engine.layers.rotary import rotary_tables

    generator = torch.Generator().manual_seed(tile.rows)
    cos_table, sin_table = rotary_tables(64, 4096, 10_000.0, torch.device(device))
    for tokens in (1, 37):
        x = _randn(generator, tokens, 256, dtype=torch.bfloat16, device=device, scale=3.0)
        residual = _randn(generator, tokens, 256, dtype=torch.bfloat16, device=device)
        weight, bias = (_randn(generator, 256, dtype=torch.bfloat16, device=device) for _ in range(2))
        for actual, expected in zip(triton_ops.add_rms_norm(x, residual, weight, 1e-6, tile=tile),
                                    fused.add_rms_norm(x, residual, weight, 1e-6)):
            _assert_close(actual, expected)
        _assert_close(triton_ops.rms_norm(x, weight, 1e-6, tile=tile), fused.rms_norm(x, weight, 1e-6))
        _assert_close(triton_ops.add_layer_norm(x, residual, weight, bias, 1e-5, tile=tile),
                      fused.add_layer_norm(x, residual, weight, bias, 1e-5))
        qkv = _randn(generator, tokens, 12 * 64, dtype=torch.bfloat16, device=device, scale=2.0)
        qk_weight = _randn(generator, 9, 64, dtype=torch.bfloat16, device=device)
        positions = torch.randint(0, 4096, (tokens,), generator=generator, dtype=torch.int32).to(device)
        args = (qkv, qk_weight, cos_table, sin_table, positions, 6, 3, 1e-6)
        for heads_per_program in (2, 8, 16):
            for actual, expected in zip(triton_ops.qk_norm_rope(*args, heads_per_program=heads_per_program,
                                                                warps=tile.warps),
                                        fused.qk_norm_rope(*args)):
                _assert_close(actual, expected)


def test_a_tile_is_powers_of_two() -> None:
    for rows, warps in ((3, 4), (4, 3), (0, 4), (4, 64)):
        with pytest.raises(ValueError, match="powers of two"):
            triton_ops.Tile(rows, warps)
