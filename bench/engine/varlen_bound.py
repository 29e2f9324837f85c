"""What a static, generous attention bound costs: varlen attention with empty padding rows and a
max_seqlen larger than the longest row, against the tight call, at the pplx-embed (Qwen3-0.6B) or the
XLM-R large (BGE-M3, bge-reranker-v2-m3) heads.

Bucket-keyed CUDA graphs hold the row count and the longest length in static buffers, so the attention
call sees the bucket's row capacity and a max_seqlen that bounds every batch the bucket can hold. The
kernel's grid is rows x ceil(max_seqlen / block) x heads; the extra blocks find no work and exit.
This prints, per case, the output difference against the tight call (must be 0) and the GPU time of
both, from CUDA graph replays. Run on a GPU: python -m quiver.bench.engine.varlen_bound
"""

from __future__ import annotations

import argparse
import json
from typing import Callable

import torch
from torch.nn.attention.varlen import varlen_attn

from quiver.worker.engine.layers.attention import AttentionSpec
from quiver.worker.engine.layers.attention_backends import DenseSdpa
from quiver.worker.engine.layers.attention_select import context_for_lens
from torch.nn.attention import SDPBackend

HEAD_SHAPES = {"qwen3": (16, 8, 128), "xlmr": (16, 16, 64)}  # query heads, key/value heads, head width
# (label, real row lengths, padded row count, generous max_seqlen)
CASES = (
    ("1x128 in bucket 128", [128], 128, 128),
    ("1x512 in bucket 512", [512], 257, 512),
    ("1x4096 in bucket 4096", [4096], 257, 4096),
    ("1x4000 in bucket 4096", [4000], 257, 4096),
    ("8x512 in bucket 4096", [512] * 8, 257, 4096),
    ("32x512 in bucket 16384, bound 16384", [512] * 32, 257, 16384),
    ("32x512 in bucket 16384, bound 512", [512] * 32, 257, 512),
    ("4x4096 in bucket 16384", [4096] * 4, 257, 16384),
    # Scoring pairs of 532 tokens in graph shapes: the length class as the bucket (before the 2,048 class)
    # and as 2,048 (buckets.length_classes now).
    ("6x532 in bucket 3328, 8 rows, bound 3328", [532] * 6, 8, 3328),
    ("6x532 in bucket 3328, 8 rows, bound 2048", [532] * 6, 8, 2048),
    ("14x532 in bucket 7680, 32 rows, bound 7680", [532] * 14, 32, 7680),
    ("14x532 in bucket 7680, 32 rows, bound 2048", [532] * 14, 32, 2048),
    ("3x1500 in bucket 4608, 8 rows, bound 4608", [1500] * 3, 8, 4608),
    ("3x1500 in bucket 4608, 8 rows, bound 2048", [1500] * 3, 8, 2048),
)


def _time_ms(fn: Callable[[], object], repeats: int = 20) -> float:
    for _ in range(2):
        fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(5):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / (repeats * 5)


def _case(spec: AttentionSpec, label: str, lens: list[int], rows: int, bound: int) -> dict[str, object]:
    tokens = sum(lens)
    q = torch.randn(tokens, spec.num_heads, spec.head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(tokens, spec.num_kv_heads, spec.head_dim, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    groups = spec.num_heads // spec.num_kv_heads
    k_wide, v_wide = (x.repeat_interleave(groups, dim=1) for x in (k, v))  # torch 2.11: no GQA
    tight_cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    padded_cu = torch.cat([tight_cu, tight_cu[-1:].repeat(rows - len(lens))])

    def tight() -> torch.Tensor:
        return varlen_attn(q, k_wide, v_wide, tight_cu, tight_cu, max(lens), max(lens))

    def generous() -> torch.Tensor:
        return varlen_attn(q, k_wide, v_wide, padded_cu, padded_cu, bound, bound)

    difference = float((tight().float() - generous().float()).abs().max())
    row: dict[str, object] = {"case": label, "max_abs_difference": difference,
                              "tight_ms": round(_time_ms(tight), 4), "generous_ms": round(_time_ms(generous), 4)}
    if len(set(lens)) == 1:
        row["dense_cudnn_ms"] = cudnn_dense_ms(q, k, v, lens, spec, _time_ms)
    return row


def cudnn_dense_ms(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: list[int], spec: AttentionSpec,
                   time_ms: Callable[[Callable[[], object]], float]) -> float | str:
    """cuDNN's dense attention on rows of one length, timed by time_ms; why it failed, if it did."""
    ctx = context_for_lens(lens, spec, torch.device("cuda"), dense=True)
    dense = DenseSdpa(SDPBackend.CUDNN_ATTENTION, "cudnn", expand_kv=False)
    try:
        return round(time_ms(lambda: dense(q, k, v, ctx)), 4)
    except Exception as exc:  # noqa: BLE001 - report, do not stop
        return f"failed: {type(exc).__name__}"


def measure(heads: str = "qwen3") -> list[dict[str, object]]:
    spec = AttentionSpec(*HEAD_SHAPES[heads], causal=False)
    return [_case(spec, *case) for case in CASES]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--heads", choices=sorted(HEAD_SHAPES), default="qwen3")
    args = parser.parse_args()
    table = measure(args.heads)
    print("| case | max abs diff | tight ms | generous ms | dense cuDNN ms |")
    print("| --- | --- | --- | --- | --- |")
    for row in table:
        print(f"| {row['case']} | {row['max_abs_difference']} | {row['tight_ms']} | {row['generous_ms']} "
              f"| {row.get('dense_cudnn_ms', '-')} |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(table, handle, indent=1)


if __name__ == "__main__":
    main()
