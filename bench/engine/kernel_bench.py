"""The elementwise units, one by one, against the bytes they must move: plain PyTorch, torch.compile and
the hand-written Triton kernels, at the pplx-embed-0.6B and BGE-M3 shapes.

    python -m quiver.bench.engine.kernel_bench [--tokens 4096,16384] [--engine DIR [--fusion auto]] [--out FILE]
    python -m quiver.bench.engine.kernel_bench --gemms [--tokens 128,512,4096] [--out FILE]
    python -m quiver.bench.engine.kernel_bench --gelu-epilogue [--tokens 128,512,4096,16384] [--out FILE]
    python -m quiver.bench.engine.kernel_bench --swiglu-product [--tokens 512,2048,4096,16384] [--out FILE]

Each unit is timed as the engine runs it, inside a CUDA graph (so Python launch cost is not counted),
over enough random input sets that they do not fit in L2, and reported in µs and achieved GB/s beside
its bound: the fewest bytes it must move (each input read
once, each output written once) over the device-to-device copy bandwidth measured in the same run.
With --engine, instead: the engine's graph replay per step with each fused set (--fusion, default
triton,compile; "auto" shows start-up's own choice), at 128 and 4096 tokens of one sequence, on
random-weight checkpoints of both shapes written under DIR. With --gemms: the dense layers' matrix
products at short inputs (gemm_bench.py). With --gelu-epilogue: BGE-M3's up projection with its bias and
GELU, separate (product, then the Triton GELU) against one cuBLASLt call with the GELU_BIAS epilogue.
With --swiglu-product: pplx-embed's gate/up product and SwiGLU, separate against one Triton kernel.
Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from functools import cache
from typing import Any, Callable

import torch

from quiver.worker.engine.layers import fused
from quiver.worker.engine.layers.rotary import rotary_tables

MODES = ("none", "compile", "triton")


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int


PPLX = Shape("pplx-embed-0.6B", 1024, 16, 8, 128, 3072)
BGE_M3 = Shape("BGE-M3", 1024, 16, 16, 64, 4096)


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy of 1 GiB, bytes read plus written, per second (GB/s)."""
    import triton.testing

    src = torch.randn(1 << 28, device="cuda")
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    return 2 * src.numel() * 4 / ms / 1e6


def unit_cases(shape: Shape, tokens: int) -> list[tuple[str, str, tuple[Any, ...], int]]:
    """(label, unit name, arguments, bytes moved) for the units the shape's model runs."""
    bf16, dev = torch.bfloat16, "cuda"
    n, inter, size = shape.hidden, shape.intermediate, 2

    def rand(*dims: int) -> torch.Tensor:
        return torch.randn(*dims, device=dev, dtype=bf16)

    if shape is PPLX:
        heads = shape.heads + shape.kv_heads
        cos, sin = rotary_tables(shape.head_dim, 32768, 1_000_000.0, torch.device(dev))
        positions = torch.randint(0, 4096, (tokens,), device=dev, dtype=torch.int32)
        qkv = rand(tokens, (heads + shape.kv_heads) * shape.head_dim)
        qk_bytes = 2 * tokens * heads * shape.head_dim * size + tokens * (4 + 2 * shape.head_dim // 2 * 4)
        return [
            ("q/k RMSNorm + rotary", "qk_norm_rope",
             (qkv, rand(heads, shape.head_dim), cos, sin, positions, shape.heads, shape.kv_heads, 1e-6), qk_bytes),
            ("residual add + RMSNorm", "add_rms_norm", (rand(tokens, n), rand(tokens, n), rand(n), 1e-6),
             4 * tokens * n * size),
            ("SwiGLU", "silu_mul", (rand(tokens, 2 * inter),), 3 * tokens * inter * size),
        ]
    return [
        ("GELU (bias in the GEMM)", "activation", (rand(tokens, inter), "gelu"), 2 * tokens * inter * size),
        ("bias + GELU", "bias_activation", (rand(tokens, inter), rand(inter), "gelu"), 2 * tokens * inter * size),
        ("residual add + LayerNorm", "add_layer_norm", (rand(tokens, n), rand(tokens, n), rand(n), rand(n), 1e-5),
         3 * tokens * n * size),
    ]


def _bias_activation(x: torch.Tensor, bias: torch.Tensor, kind: str) -> torch.Tensor:
    return fused.activation(x + bias, kind)


@cache
def _compiled_bias_activation() -> Callable[..., Any]:
    return torch.compile(_bias_activation, fullgraph=True)


def unit_function(ops: fused.ElementwiseOps, unit: str) -> Callable[..., Any]:
    """The set's function for a unit; bias + activation, not a unit of the sets (the engine keeps the
    bias in the GEMM), is the plain add + activation, that compiled, or the Triton kernel."""
    if unit != "bias_activation":
        return getattr(ops, unit)
    if ops.mode == "triton":
        from quiver.worker.engine.layers import triton_ops

        return triton_ops.bias_activation
    return _compiled_bias_activation() if ops.mode == "compile" else _bias_activation


def graph_time_us(fn: Callable[..., Any], arg_sets: list[tuple[Any, ...]], trials: int = 5) -> float:
    """µs per call, as the engine runs them: one call per input set captured in a CUDA graph (no launch
    gaps), replayed; the sets together outgrow the L2 cache, so each call reads from memory. Median of
    trials."""
    for args in arg_sets:
        fn(*args)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for args in arg_sets:
            fn(*args)
    graph.replay()
    times = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(REPLAYS):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / REPLAYS / len(arg_sets))
    del graph
    return sorted(times)[len(times) // 2]


REPLAYS = 10
L2_FLUSH_BYTES = 4 * 60 * 2**20  # the input sets of one timing together: four times the H200's L2


def bench_units(tokens_list: list[int], bandwidth: float) -> list[dict[str, Any]]:
    op_sets = {"none": fused.plain_ops(), "compile": fused.compiled_ops(), "triton": fused.triton_kernel_ops()}
    rows = []
    for shape in (PPLX, BGE_M3):
        for tokens in tokens_list:
            first = unit_cases(shape, tokens)
            copies = max(2, -(-L2_FLUSH_BYTES // min(case[3] for case in first)))
            sets = [first] + [unit_cases(shape, tokens) for _ in range(copies - 1)]
            for index, (label, unit, _, moved) in enumerate(first):
                row: dict[str, Any] = {"shape": shape.name, "unit": label, "tokens": tokens, "bytes": moved,
                                       "bound_us": moved / bandwidth / 1e3, "input_sets": copies}
                for mode, ops in op_sets.items():
                    us = graph_time_us(unit_function(ops, unit), [cases[index][2] for cases in sets])
                    row[f"{mode}_us"] = us
                    row[f"{mode}_gbs"] = moved / us / 1e3
                rows.append(row)
                print_row(row)
            del sets, first
            torch.cuda.empty_cache()
    return rows


def print_row(row: dict[str, Any]) -> None:
    times = "  ".join(f"{row[f'{m}_us']:7.1f} µs {row[f'{m}_gbs']:5.0f} GB/s" for m in MODES)
    ratio = row["triton_us"] / row["bound_us"]
    print(f"| {row['shape']:15} | {row['unit']:24} | {row['tokens']:5} | {row['bound_us']:6.1f} | {times} | "
          f"{ratio:4.2f} x bound |", flush=True)


def bench_engine(ckpt_dir: str, modes: list[str]) -> list[dict[str, Any]]:
    """Graph replay ms per step (one sequence of 128 and of 4096 tokens) with each fused set."""
    from pathlib import Path

    from quiver.bench.engine.checkpoints import BENCH_MODELS, ensure_bench_checkpoint
    from quiver.bench.engine.profile_kernels import replay_ms
    from quiver.worker.engine import load_engine
    from quiver.worker.engine.engine import synthetic_batch

    rows = []
    for name in sorted(BENCH_MODELS):
        path = ensure_bench_checkpoint(name, Path(ckpt_dir))
        for mode in modes:
            start = time.perf_counter()
            engine = load_engine(path, device="cuda", fusion=mode)
            row: dict[str, Any] = {"model": name, "fusion": engine.info.fusion, "detail": engine.info.startup_detail,
                                   "load_s": round(time.perf_counter() - start, 1)}
            for tokens in (128, 4096):
                gpu, cpu = replay_ms(engine, synthetic_batch(tokens, tokens, engine.info.model.vocab_size, 0))
                row[f"replay_ms_{tokens}"], row[f"replay_cpu_ms_{tokens}"] = round(gpu, 3), round(cpu, 3)
            print("engine:", json.dumps(row), flush=True)
            rows.append(row)
            del engine
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="4096,16384")
    parser.add_argument("--out", default=None, help="write the figures as JSON here")
    parser.add_argument("--engine", default=None, metavar="DIR", help="time whole engine steps instead")
    parser.add_argument("--fusion", default="triton,compile", help="with --engine: the fusion modes to load")
    parser.add_argument("--gemms", action="store_true", help="time the dense layers' products instead")
    parser.add_argument("--gelu-epilogue", action="store_true",
                        help="time a GELU layer's product, bias and GELU, separate and in one call, instead")
    parser.add_argument("--swiglu-product", action="store_true",
                        help="time a SwiGLU layer's gate/up product and SwiGLU, separate and in one kernel, instead")
    args = parser.parse_args()
    torch.manual_seed(0)
    bandwidth = copy_bandwidth_gbs()
    print(f"{torch.cuda.get_device_name()}: device-to-device copy {bandwidth:.0f} GB/s (read + write)")
    if not (args.engine or args.gemms or args.gelu_epilogue or args.swiglu_product):
        print("| shape | unit | tokens | bound µs | " + " | ".join(f"{m}: µs, GB/s" for m in MODES) + " | Triton |")
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "copy_gbs": bandwidth}
    if args.gemms:
        from quiver.bench.engine import gemm_bench

        gemm_bench.print_header()
        result["gemms"] = gemm_bench.bench_gemms([int(t) for t in args.tokens.split(",")], bandwidth)
    elif args.gelu_epilogue:
        from quiver.bench.engine import gemm_bench

        result["gelu_epilogue"] = gemm_bench.bench_gelu_epilogue([int(t) for t in args.tokens.split(",")])
    elif args.swiglu_product:
        from quiver.bench.engine import gemm_bench

        result["swiglu_product"] = gemm_bench.bench_swiglu_product([int(t) for t in args.tokens.split(",")], bandwidth)
    elif args.engine:
        result["engine"] = bench_engine(args.engine, args.fusion.split(","))
    else:
        result["units"] = bench_units([int(t) for t in args.tokens.split(",")], bandwidth)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
