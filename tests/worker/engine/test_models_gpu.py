"""GPU tests (skipped without CUDA): the published pplx-embed, SPLADE and BGE-M3 layouts at real widths, served
in bf16 (with CUDA graphs where the output is pooled), against the same checkpoints in float32 on the same GPU."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest
import torch

from quiver.worker.engine import Batch, load_engine
from tests.worker.engine.published import bge_m3, pplx_embed, splade

pytestmark = pytest.mark.gpu

PPLX_0_6B = dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, max_position_embeddings=32768, vocab_size=151936)
XLMR_LARGE = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                  max_position_embeddings=8194, vocab_size=250002)
BERT_BASE = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                 max_position_embeddings=512, vocab_size=30522)


def _rows(path: Path, dtype: str, lengths: list[int], vocab: int, repeats: int = 2,
          cuda_graphs: bool = True) -> np.ndarray:
    """The engine's rows for random sequences of `lengths`, stepped `repeats` times (graphs replay after the first)."""
    engine = load_engine(path, device="cuda", dtype=dtype, cuda_graphs=cuda_graphs)
    rng = np.random.default_rng(0)
    sequences = [rng.integers(5, vocab, size=n, dtype=np.int32) for n in lengths]
    batch = Batch(input_ids=np.concatenate(sequences), seq_lens=np.array(lengths, dtype=np.int32))
    rows = None
    for _ in range(repeats):
        lazy = engine.step(batch)
        rows = lazy.wait().copy()
        lazy.release()
    assert rows is not None
    del engine, lazy
    _release_gpu_memory()
    return rows


def _release_gpu_memory() -> None:
    """Give a dropped engine's memory back before the next engine loads."""
    gc.collect()
    torch.cuda.empty_cache()


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_pplx_embed_bf16_against_float32(tmp_path: Path) -> None:
    path = pplx_embed(tmp_path, PPLX_0_6B)
    lengths = [128, 512, 4096, 7]
    # The float32 reference runs eagerly and first: a served engine's graphs take most of the GPU's memory.
    fp32 = _rows(path, "float32", lengths, PPLX_0_6B["vocab_size"], cuda_graphs=False)
    bf16 = _rows(path, "bfloat16", lengths, PPLX_0_6B["vocab_size"])
    cosines = _cosines(bf16, fp32)
    assert cosines.min() >= 0.999, f"cosines by length {dict(zip(lengths, cosines.round(6).tolist()))}"  # the design's gate


def test_splade_bf16_against_float32(tmp_path: Path) -> None:
    path = splade(tmp_path, BERT_BASE)
    lengths = [16, 128, 512, 64]
    fp32 = _rows(path, "float32", lengths, BERT_BASE["vocab_size"], cuda_graphs=False)
    bf16 = _rows(path, "bfloat16", lengths, BERT_BASE["vocab_size"])
    assert bf16.shape == (len(lengths), BERT_BASE["vocab_size"])
    assert _cosines(bf16, fp32).min() >= 0.999
    for low, high in zip(bf16, fp32):  # the strongest terms agree
        top = set(np.argsort(high)[-50:])
        assert len(top & set(np.argsort(low)[-50:])) >= 45


def _token_rows(path: Path, dtype: str, lengths: list[int], vocab: int) -> np.ndarray:
    """Every token's row (the "tokens" task), which runs eagerly: no graphs to capture."""
    engine = load_engine(path, device="cuda", dtype=dtype, cuda_graphs=False, fusion="none")
    rng = np.random.default_rng(0)
    ids = np.concatenate([rng.integers(5, vocab, size=n, dtype=np.int32) for n in lengths])
    lazy = engine.step(Batch(input_ids=ids, seq_lens=np.array(lengths, dtype=np.int32), token_rows=True))
    rows = lazy.wait().copy()
    lazy.release()
    return rows


def _lexical_weights_agree(bf16: np.ndarray, fp32: np.ndarray, lengths: list[int]) -> None:
    """Each sequence's lexical weights: cosine ≥ 0.999 and no weight off by more than 3 % of the largest."""
    starts = np.concatenate([[0], np.cumsum(lengths)])
    for start, end in zip(starts[:-1], starts[1:]):
        low, high = bf16[start:end], fp32[start:end]
        assert float(low @ high) >= 0.999 * float(np.linalg.norm(low) * np.linalg.norm(high))
        assert np.abs(low - high).max() <= 0.03 * max(float(high.max()), 1e-6)


def test_bge_m3_outputs_bf16_against_float32(tmp_path: Path) -> None:
    path = bge_m3(tmp_path, XLMR_LARGE)
    lengths = [16, 512, 2048, 7]
    bf16 = _token_rows(path, "bfloat16", lengths, 30000)
    fp32 = _token_rows(path, "float32", lengths, 30000)
    hidden = XLMR_LARGE["hidden_size"]
    assert bf16.shape == (sum(lengths), hidden + 1)
    firsts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    others = np.setdiff1d(np.arange(sum(lengths)), firsts)
    assert _cosines(bf16[firsts, :hidden], fp32[firsts, :hidden]).min() >= 0.999  # dense
    assert _cosines(bf16[others, :hidden], fp32[others, :hidden]).mean() >= 0.999  # ColBERT


def test_bge_m3_lexical_weights_bf16_against_float32(tmp_path: Path) -> None:
    """At BGE-M3's widths but 4 layers: with random weights, 24 layers leave the final token states nearly
    collinear, and the stand-in's sparse bias (at the median of w·h over its texts) then cancels all but a
    sliver of w·h, so bf16's rounding of the states becomes most of each weight (cosine 0.994 on the CPU,
    against 0.9998 at 4 layers); a trained head does not sit there."""
    path = bge_m3(tmp_path, dict(XLMR_LARGE, num_hidden_layers=4))
    lengths = [16, 512, 2048, 7]
    hidden = XLMR_LARGE["hidden_size"]
    bf16 = _token_rows(path, "bfloat16", lengths, 30000)[:, hidden]
    fp32 = _token_rows(path, "float32", lengths, 30000)[:, hidden]
    assert (fp32 > 0).mean() > 0.1  # some tokens carry weight
    _lexical_weights_agree(bf16, fp32, lengths)
