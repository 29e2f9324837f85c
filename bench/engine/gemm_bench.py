"""The dense layers' matrix products at short inputs: how fast their weights are read.

    python -m quiver.bench.engine.kernel_bench --gemms [--tokens 128,512,4096] [--out FILE]

For each product of one layer of the pplx-embed-0.6B (Qwen3) and BGE-M3 (XLM-R) shapes, at M tokens:
cuBLAS as the engine calls it (F.linear on the fused q/k/v and gate/up weights), the same with torch's
cuBLASLt preference, the unfused products (q, k, v and gate, up as separate calls, as the checkpoints
store them), the split-K Triton kernel (split_k_gemm.py; the fastest of its candidate
plans, each checked against a float32 product and for run-to-run equality first), and FP8
(torch._scaled_mm on e4m3 weights with per-channel scales:
the product alone, and with the per-token quantisation of its input before it). Each is timed inside a
CUDA graph over enough weight copies that they outgrow L2 (every call reads its weight from memory);
the figure is µs per product and the weight read in TB/s (weight bytes / time; an FP8 weight has half
the bytes).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from quiver.bench.engine import split_k_gemm
from quiver.worker.engine.layers import triton_ops
from quiver.worker.engine.layers.linear import Fp8Weight, fp8_linear, quantize_weight

# (shape, product, out features, in features, parts of the fused weight as the checkpoint stores them)
PRODUCTS = [
    ("pplx-embed-0.6B", "qkv", 4096, 1024, (2048, 1024, 1024)),
    ("pplx-embed-0.6B", "o", 1024, 2048, (1024,)),
    ("pplx-embed-0.6B", "gate_up", 6144, 1024, (3072, 3072)),
    ("pplx-embed-0.6B", "down", 1024, 3072, (1024,)),
    ("BGE-M3", "qkv", 3072, 1024, (1024, 1024, 1024)),
    ("BGE-M3", "o", 1024, 1024, (1024,)),
    ("BGE-M3", "up", 4096, 1024, (4096,)),
    ("BGE-M3", "down", 1024, 4096, (1024,)),
]
L2_FLUSH_BYTES = 4 * 60 * 2**20
VARIANTS = ("cublas", "cublaslt", "unfused", "split_k", "fp8_gemm", "fp8")


def _graph_us(calls: list[Callable[[], Any]], replays: int = 10, trials: int = 5) -> float:
    for call in calls:
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    times = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / replays / len(calls))
    return sorted(times)[len(times) // 2]


def _variant_calls(variant: str, x: torch.Tensor, weights: list[torch.Tensor], fp8: list[Fp8Weight],
                   parts: tuple[int, ...]) -> list[Callable[[], Any]]:
    if variant in ("cublas", "cublaslt"):
        return [lambda w=w: torch.nn.functional.linear(x, w) for w in weights]
    if variant == "unfused":
        return [lambda w=w: [torch.nn.functional.linear(x, p) for p in w.split(list(parts))] for w in weights]
    if variant == "fp8_gemm":
        data, scale = triton_ops.quantize_rows(x)
        return [lambda f=f: torch._scaled_mm(data, f.data.t(), scale_a=scale, scale_b=f.scale,
                                             out_dtype=torch.bfloat16) for f in fp8]
    return [lambda f=f: fp8_linear(x, f, None, triton_ops.quantize_rows) for f in fp8]


def bench_gemms(tokens_list: list[int], bandwidth_gbs: float) -> list[dict[str, Any]]:
    rows = []
    preferred = torch.backends.cuda.preferred_blas_library()
    for shape, product, n, k, parts in PRODUCTS:
        weight_bytes = n * k * 2
        copies = max(2, -(-L2_FLUSH_BYTES // weight_bytes))
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        fp8 = [q for q in map(quantize_weight, weights) if isinstance(q, Fp8Weight)]
        for tokens in tokens_list:
            x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
            row: dict[str, Any] = {"shape": shape, "product": product, "M": tokens, "N": n, "K": k,
                                   "bound_us": weight_bytes / bandwidth_gbs / 1e3}
            for variant in VARIANTS:
                if variant == "unfused" and len(parts) == 1:
                    continue
                if variant == "split_k":
                    _bench_split_k(row, x, weights)
                    continue
                torch.backends.cuda.preferred_blas_library("cublaslt" if variant == "cublaslt" else preferred)
                try:
                    us = _graph_us(_variant_calls(variant, x, weights, fp8, parts))
                except Exception as exc:  # noqa: BLE001 - a variant this torch/GPU cannot run: say so, go on
                    print(f"  {shape} {product} M={tokens} {variant}: failed: {exc}", flush=True)
                    continue
                read = weight_bytes // (2 if variant.startswith("fp8") else 1)
                row[f"{variant}_us"], row[f"{variant}_tbs"] = round(us, 2), round(read / us / 1e6, 2)
            torch.backends.cuda.preferred_blas_library(preferred)
            rows.append(row)
            print("| " + " | ".join([shape, product, str(tokens), f"{row['bound_us']:.1f}"] + [
                f"{row[f'{v}_us']:.1f} ({row[f'{v}_tbs']:.2f})" if f"{v}_us" in row else "-" for v in VARIANTS
            ]) + " |", flush=True)
            if "split_k_plan" in row:
                print(f"    split_k plan (block m, n, k, split, stages, warps) {row['split_k_plan']}, "
                      f"largest relative error of any plan {row['split_k_max_rel_error']}", flush=True)
        del weights, fp8
        torch.cuda.empty_cache()
    return rows


def _check_plan(gemm: split_k_gemm.SplitKGemm, plan: split_k_gemm.GemmPlan, x: torch.Tensor,
                weight: torch.Tensor) -> float:
    """The plan's largest error against a float32 product, relative to that product's largest value;
    raises if two runs differ (the split sums must be added in a fixed order)."""
    first = gemm.run(plan, x, weight)
    second = gemm.run(plan, x, weight)
    if not torch.equal(first, second):
        raise AssertionError(f"{plan}: two runs differ")
    reference = x.float() @ weight.float().t()
    return float((first.float() - reference).abs().max() / reference.abs().max())


def _bench_split_k(row: dict[str, Any], x: torch.Tensor, weights: list[torch.Tensor]) -> None:
    """Time every candidate plan of this shape; the row gets the fastest, its plan, and every plan's µs."""
    gemm = split_k_gemm.SplitKGemm(x.device)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    timed = []
    for plan in split_k_gemm.candidate_plans(row["M"], row["N"], row["K"], sms):
        try:
            error = _check_plan(gemm, plan, x, weights[0])
            us = _graph_us([lambda w=w, p=plan: gemm.run(p, x, w) for w in weights])
        except Exception as exc:  # noqa: BLE001 - a plan that fails is reported and skipped
            print(f"  split_k {plan} M={row['M']} N={row['N']} K={row['K']}: failed: {exc}", flush=True)
            continue
        timed.append({"plan": list(vars(plan).values()), "us": round(us, 2), "rel_error": round(error, 5)})
    if not timed:
        return
    best = min(timed, key=lambda t: t["us"])
    row["split_k_us"] = best["us"]
    row["split_k_tbs"] = round(row["N"] * row["K"] * 2 / best["us"] / 1e6, 2)
    row["split_k_plan"] = best["plan"]
    row["split_k_plans"] = timed
    row["split_k_max_rel_error"] = max(t["rel_error"] for t in timed)


def bench_gelu_epilogue(tokens_list: list[int]) -> list[dict[str, Any]]:
    """BGE-M3's up projection with its bias and GELU: the product then the Triton GELU (the separate
    units), against one torch._addmm_activation (cuBLASLt's GELU_BIAS epilogue), µs per call in a graph."""
    n, k = 4096, 1024
    copies = max(2, -(-L2_FLUSH_BYTES // (n * k * 2)))
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16) * 0.1
    rows = []
    print("| BGE-M3 up + bias + GELU, M | separate µs | epilogue µs | separate / epilogue |")
    print("| --- | --- | --- | --- |")
    for tokens in tokens_list:
        x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
        separate = _graph_us([lambda w=w, x=x: triton_ops.activation(torch.nn.functional.linear(x, w, bias), "gelu")
                              for w in weights])
        epilogue = _graph_us([lambda w=w, x=x: torch._addmm_activation(bias, x, w.t(), use_gelu=True)
                              for w in weights])
        rows.append({"M": tokens, "separate_us": round(separate, 2), "epilogue_us": round(epilogue, 2)})
        print(f"| {tokens} | {separate:.1f} | {epilogue:.1f} | {separate / epilogue:.2f} |", flush=True)
    return rows


def bench_swiglu_product(tokens_list: list[int], bandwidth: float) -> list[dict[str, Any]]:
    """Qwen3-0.6B's gate/up product and SwiGLU: the product then the Triton SwiGLU (the separate units)
    against the one kernel of swiglu_product.py, µs per call in a graph over weight copies that outgrow L2.
    The bound is the one kernel's bytes (input, weight, output once each) at the copy bandwidth."""
    from quiver.worker.engine.layers import swiglu_product

    k, inter = 1024, 3072
    copies = max(2, -(-L2_FLUSH_BYTES // (2 * inter * k * 2)))
    weights = [(torch.randn(2 * inter, k, device="cuda") * k ** -0.5).bfloat16() for _ in range(copies)]
    rows = []
    print("| Qwen3-0.6B gate/up + SwiGLU, M | bound µs | separate µs | one kernel µs | one kernel × bound | "
          "separate / one kernel | elements differing |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for tokens in tokens_list:
        x = torch.randn(tokens, k, device="cuda").bfloat16()
        separate = _graph_us([lambda w=w, x=x: triton_ops.silu_mul(torch.nn.functional.linear(x, w))
                              for w in weights])
        one = _graph_us([lambda w=w, x=x: swiglu_product.gate_up_silu(x, w) for w in weights])
        bound = (tokens * k + 2 * inter * k + tokens * inter) * 2 / bandwidth / 1e3
        differing = (swiglu_product.gate_up_silu(x, weights[0])
                     != triton_ops.silu_mul(torch.nn.functional.linear(x, weights[0]))).float().mean().item()
        rows.append({"M": tokens, "bound_us": round(bound, 2), "separate_us": round(separate, 2),
                     "one_kernel_us": round(one, 2), "differing": differing})
        print(f"| {tokens} | {bound:.1f} | {separate:.1f} | {one:.1f} | {one / bound:.2f} | {separate / one:.2f} | "
              f"{differing:.2%} |", flush=True)
    return rows


def print_header() -> None:
    print("| shape | product | M | bound µs (weight read at the copy bandwidth) | " +
          " | ".join(f"{v} µs (TB/s)" for v in VARIANTS) + " |")
