"""The Triton attention kernel (worker/engine/layers/triton_attention.py) against FlashAttention-2 on ragged
rows and cuDNN's dense kernel, at the real heads, for each of a few launch tiles.

Each case is laid out as a graph step lays it out: the real rows, then empty rows up to the step's row class,
and a max_seqlen bound at least the longest row. Every time is GPU time from CUDA graph replays of several
calls (no launch overhead), in ms per call, the median of five trials. Each tile's output is compared with
float32 attention of each row alone (relative L2 error; a tile the compiler refuses reports why). On a GPU:

    python -m quiver.bench.engine.attention_tiles --json tiles.json
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Callable

import torch
import torch.nn.functional as F

from quiver.bench.engine.kernel_bench import graph_time_us
from quiver.bench.engine.varlen_bound import HEAD_SHAPES, cudnn_dense_ms
from quiver.worker.engine.layers.attention import AttentionSpec
from quiver.worker.engine.layers.attention_backends import AtenFlashVarlen
from quiver.worker.engine.layers.attention_select import context_for_lens
from quiver.worker.engine.layers.triton_attention import AttentionTile, tile_for, varlen_attention

# (label, real row lengths, rows of the step with its empty ones, max_seqlen bound)
CASES = (
    ("1x128", [128], 2, 512),
    ("1x500 in 512", [500], 2, 512),
    ("6x512 (concurrency step)", [512] * 6, 8, 512),
    ("6x532, bound 2048", [532] * 6, 8, 2048),
    ("14x532, bound 2048", [532] * 14, 32, 2048),
    ("32x512", [512] * 32, 32, 512),
    ("mixed 40..1500 x 12, bound 2048", [40, 1500, 300, 512, 77, 900, 1200, 64, 700, 128, 256, 1000], 32, 2048),
    ("1x4000 in 4096", [4000], 2, 4096),
    ("1x4096", [4096], 2, 4096),
    ("4x4096", [4096] * 4, 8, 8192),
)
TILES = (
    AttentionTile(64, 64, 4, 3), AttentionTile(128, 64, 8, 3), AttentionTile(128, 64, 4, 3),
    AttentionTile(128, 128, 8, 2), AttentionTile(128, 32, 4, 3), AttentionTile(64, 32, 4, 4),
    AttentionTile(128, 128, 8, 3), AttentionTile(128, 64, 8, 2),
)
# Around the first tile, the fastest of those above at nearly every case on an H100 (--near-default).
NEAR_DEFAULT_TILES = (
    AttentionTile(64, 64, 4, 3), AttentionTile(64, 64, 4, 2), AttentionTile(64, 64, 4, 4),
    AttentionTile(64, 128, 4, 2), AttentionTile(64, 128, 8, 2), AttentionTile(64, 32, 4, 3),
    AttentionTile(64, 64, 8, 3), AttentionTile(32, 64, 4, 3),
    # two query heads of one key head a program (Qwen3's GQA; the same as one head for XLM-R's)
    AttentionTile(64, 64, 4, 3, heads=2), AttentionTile(64, 64, 8, 3, heads=2), AttentionTile(32, 64, 4, 3, heads=2),
    AttentionTile(64, 32, 4, 3, heads=2),
)


def graph_ms(fn: Callable[[], object], calls: int = 5) -> float:
    """GPU ms per call: calls of fn captured in one CUDA graph and replayed (kernel_bench.graph_time_us)."""
    return graph_time_us(fn, [()] * calls) / 1e3


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lens: list[int], spec: AttentionSpec) -> torch.Tensor:
    """float32 attention of each row alone."""
    groups = spec.num_heads // spec.num_kv_heads
    rows, at = [], 0
    for length in lens:
        part = [x[at:at + length].float().transpose(0, 1) for x in (q, k, v)]
        kk, vv = (x.repeat_interleave(groups, dim=0) for x in part[1:])
        rows.append(F.scaled_dot_product_attention(part[0], kk, vv, is_causal=spec.causal, scale=spec.scale)
                    .transpose(0, 1))
        at += length
    return torch.cat(rows)


def _case(spec: AttentionSpec, label: str, lens: list[int], rows: int, bound: int,
          tiles: tuple[AttentionTile, ...]) -> dict[str, Any]:
    tokens = sum(lens)
    widths = [spec.num_heads * spec.head_dim] + [spec.num_kv_heads * spec.head_dim] * 2
    fused = torch.randn(tokens, sum(widths), device="cuda", dtype=torch.bfloat16)
    q, k, v = (part.view(tokens, -1, spec.head_dim) for part in fused.split(widths, dim=-1))
    ctx = context_for_lens(lens + [0] * (rows - len(lens)), spec, torch.device("cuda"), max_seqlen=bound)
    expected = reference(q, k, v, lens, spec)
    result: dict[str, Any] = {"case": label, "tokens": tokens}
    flash = AtenFlashVarlen()
    result["flash2_ms"] = round(graph_ms(lambda: flash(q, k, v, ctx)), 4)
    if len(set(lens)) == 1:
        result["cudnn_dense_ms"] = cudnn_dense_ms(q, k, v, lens, spec, graph_ms)
    for tile in tiles:
        name = f"{tile.block_m}x{tile.block_n}/w{tile.warps}/s{tile.stages}" + (f"/h{tile.heads}" if tile.heads > 1 else "")
        try:
            out = varlen_attention(q, k, v, ctx.cu_seqlens, bound, spec.scale, spec.causal, tile)
            error = float((out.float() - expected).norm() / expected.norm())
            ms = graph_ms(lambda t=tile: varlen_attention(q, k, v, ctx.cu_seqlens, bound, spec.scale, spec.causal, t))
            result[name] = {"ms": round(ms, 4), "error": round(error, 5)}
        except Exception as exc:  # noqa: BLE001 - a tile the compiler refuses (shared memory) is reported
            result[name] = {"failed": f"{type(exc).__name__}: {str(exc).splitlines()[0][:80] if str(exc) else ''}"}
    return result


def measure(heads: str, causal: bool, tiles: tuple[AttentionTile, ...]) -> list[dict[str, Any]]:
    spec = AttentionSpec(*HEAD_SHAPES[heads], causal=causal)
    return [_case(spec, *case, tiles=tiles) for case in CASES]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument("--heads", default="xlmr,qwen3")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--tiles", choices=("survey", "near-default", "default"), default="survey")
    args = parser.parse_args()
    tables = {}
    for heads in args.heads.split(","):
        tiles = {"survey": TILES, "near-default": NEAR_DEFAULT_TILES,
                 "default": (tile_for(HEAD_SHAPES[heads][2]),)}[args.tiles]
        table = measure(heads, args.causal, tiles)
        tables[heads] = table
        names = [key for key in table[0] if "/w" in key]
        print(f"\n{heads} heads {HEAD_SHAPES[heads]}{', causal' if args.causal else ''}: GPU ms per call "
              f"(largest relative error of any tile: "
              f"{max(r[n].get('error', 0) for r in table for n in names)})")
        print("| case | FA2 | cuDNN dense | " + " | ".join(names) + " | best / FA2 |")
        print("| --- " * (len(names) + 4) + "|")
        for row in table:
            times = {n: row[n]["ms"] for n in names if "ms" in row[n]}
            best = min(times.values()) if times else float("nan")
            cells = [str(row[n].get("ms", "x")) for n in names]
            print(f"| {row['case']} | {row['flash2_ms']} | {row.get('cudnn_dense_ms', '-')} | " + " | ".join(cells)
                  + f" | {best / row['flash2_ms']:.2f} |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(tables, handle, indent=1)


if __name__ == "__main__":
    main()
