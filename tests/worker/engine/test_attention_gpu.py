"""GPU tests (skipped without CUDA): every attention backend the selector keeps agrees with a float32
reference at real head shapes and sizes beyond its start-up check: ragged rows with empty ones (as graph
shapes carry), a generous max_seqlen bound, and equal rows run dense."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

from quiver.worker.engine.layers.attention import AttentionSpec
from quiver.worker.engine.layers.attention_backends import PaddedSdpa
from quiver.worker.engine.layers.attention_select import AttentionSelector, _random_qkv, context_for_lens

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

SPECS = {
    "qwen3 (GQA 16/8 x 128)": AttentionSpec(num_heads=16, num_kv_heads=8, head_dim=128, causal=False),
    "qwen3 causal (GQA 16/8 x 128)": AttentionSpec(num_heads=16, num_kv_heads=8, head_dim=128, causal=True),
    "xlm-r large (16 x 64)": AttentionSpec(num_heads=16, num_kv_heads=16, head_dim=64, causal=False),
}
RAGGED = [517, 1, 0, 300, 2048, 64, 0, 0]
HAS_TRITON = importlib.util.find_spec("triton") is not None
TOLERANCE = 2e-2  # relative L2 error, as the selector's own check; bf16 lands near 4e-3


@pytest.mark.parametrize("spec_name", sorted(SPECS))
def test_kept_backends_match_float32_at_real_sizes(spec_name: str) -> None:
    spec, device = SPECS[spec_name], torch.device("cuda")
    selector = AttentionSelector(spec, device, torch.bfloat16)
    assert "aten_flash_varlen" in selector.names, selector.rejected  # GQA-native FlashAttention-2
    assert "triton_varlen" in selector.names or not HAS_TRITON, selector.rejected
    cases = [
        context_for_lens(RAGGED, spec, device),
        context_for_lens(RAGGED, spec, device, max_seqlen=4096),  # a graph shape's generous bound
        context_for_lens([1024] * 6, spec, device, dense=True),
    ]
    checked = 0
    for ctx in cases:
        q, k, v = _random_qkv(ctx, torch.bfloat16)
        reference = PaddedSdpa()(q.float(), k.float(), v.float(), ctx)
        for backend in selector.backends:
            if not backend.supports(ctx, torch.bfloat16) or isinstance(backend, PaddedSdpa):
                continue
            out = backend(q, k, v, dataclasses.replace(ctx, backend=backend)).float()
            error = float((out - reference).norm() / reference.norm())
            assert error < TOLERANCE, (backend.name, ctx.num_seqs, ctx.max_seqlen, ctx.dense_len, error)
            checked += 1
    assert checked >= 3


@pytest.mark.parametrize("spec_name", sorted(SPECS))
def test_kept_backends_replayed_from_a_graph_follow_the_lengths_written_into_it(spec_name: str) -> None:
    """A graph step keeps its cumulative lengths in a static buffer and writes each batch's into it before
    the replay: every kept ragged backend, captured on one split of the tokens and replayed on another,
    gives the float32 reference of the other split (a backend that read the lengths on the host at
    capture would not)."""
    spec, device = SPECS[spec_name], torch.device("cuda")
    selector = AttentionSelector(spec, device, torch.bfloat16)
    first = context_for_lens(RAGGED, spec, device, max_seqlen=4096)
    other_lens = [300, 217, 300, 1, 1024, 1024, 64, 0]  # the same 2,930 tokens, rows cut elsewhere
    other = context_for_lens(other_lens, spec, device, max_seqlen=4096)
    q, k, v = _random_qkv(first, torch.bfloat16)
    reference = PaddedSdpa()(q.float(), k.float(), v.float(), other)
    checked = []
    for backend in selector.backends:
        if not backend.supports(first, torch.bfloat16) or isinstance(backend, PaddedSdpa):
            continue
        ctx = dataclasses.replace(first, cu_seqlens=first.cu_seqlens.clone(), backend=backend)
        out = backend(q, k, v, ctx)  # warm-up outside the capture (plans, workspaces)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = backend(q, k, v, ctx)
        ctx.cu_seqlens.copy_(other.cu_seqlens)
        graph.replay()
        torch.cuda.synchronize()
        error = float((out.float() - reference).norm() / reference.norm())
        assert error < TOLERANCE, (backend.name, error)
        checked.append(backend.name)
    assert "aten_flash_varlen" in checked, checked
    assert "triton_varlen" in checked or not HAS_TRITON, checked
    print(f"{spec_name}: replayed on other lengths: {checked}")
