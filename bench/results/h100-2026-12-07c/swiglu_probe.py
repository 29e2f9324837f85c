"""Probe: Qwen3's gate/up product then SwiGLU, as the engine runs it (cuBLAS + Triton silu_mul) against one
Triton kernel that keeps two accumulators and writes silu(gate) * up, at large token counts.
Variants: plain pointer loads, and TMA descriptors (host-side). Times in a CUDA graph of 10 launches."""
import sys
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from quiver.worker.engine.layers.triton_ops import silu_mul


@triton.jit
def _ptr_kernel(x_ptr, w_ptr, out_ptr, M, N, K, GROUP_M: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = N // BLOCK_N
    group = GROUP_M * tiles_n
    first_m = (pid // group) * GROUP_M
    size_m = min(tiles_m - first_m, GROUP_M)
    tile_m = first_m + (pid % group) % size_m
    tile_n = (pid % group) // size_m
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    inner = tl.arange(0, BLOCK_K)
    row_ok = (rows < M)[:, None]
    x_ptrs = x_ptr + rows[:, None].to(tl.int64) * K + inner[None, :]
    g_ptrs = w_ptr + cols[None, :].to(tl.int64) * K + inner[:, None]
    u_ptrs = g_ptrs + N * K
    ga = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ua = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in tl.range(0, K, BLOCK_K):
        x = tl.load(x_ptrs, mask=row_ok, other=0.0)
        ga = tl.dot(x, tl.load(g_ptrs), ga)
        ua = tl.dot(x, tl.load(u_ptrs), ua)
        x_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    dt = out_ptr.dtype.element_ty
    g = ga.to(dt).to(tl.float32)
    s = (g * tl.sigmoid(g)).to(dt).to(tl.float32)
    out = s * ua.to(dt).to(tl.float32)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * N + cols[None, :], out.to(dt), mask=row_ok)


@triton.jit
def _tma_kernel(x_desc, w_desc, out_desc, M, N, K, GROUP_M: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = N // BLOCK_N
    group = GROUP_M * tiles_n
    first_m = (pid // group) * GROUP_M
    size_m = min(tiles_m - first_m, GROUP_M)
    tile_m = first_m + (pid % group) % size_m
    tile_n = (pid % group) // size_m
    off_m = tile_m * BLOCK_M
    off_n = tile_n * BLOCK_N
    ga = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ua = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in tl.range(0, K, BLOCK_K):
        x = x_desc.load([off_m, k])
        ga = tl.dot(x, w_desc.load([off_n, k]).T, ga)
        ua = tl.dot(x, w_desc.load([off_n + N, k]).T, ua)
    dt = out_desc.dtype
    g = ga.to(dt).to(tl.float32)
    s = (g * tl.sigmoid(g)).to(dt).to(tl.float32)
    out_desc.store([off_m, off_n], (s * ua.to(dt).to(tl.float32)).to(dt))


def run_ptr(x, w, out, plan):
    bm, bn, bk, st, wp, gm = plan
    m, k = x.shape
    n = out.shape[1]
    grid = (triton.cdiv(m, bm) * (n // bn),)
    _ptr_kernel[grid](x, w, out, m, n, k, GROUP_M=gm, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                      num_stages=st, num_warps=wp)


def run_tma(descs, m, n, k, plan):
    bm, bn, bk, st, wp, gm = plan
    xd, wd, od = descs
    grid = (triton.cdiv(m, bm) * (n // bn),)
    _tma_kernel[grid](xd, wd, od, m, n, k, GROUP_M=gm, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                      num_stages=st, num_warps=wp)


def graph_us(fn, launches=10, reps=15):
    fn()
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(launches):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / launches)
    times.sort()
    return times[len(times) // 2]


PLANS2 = [(128, 64, 64, 3, 8, 8), (128, 64, 64, 4, 8, 8), (128, 64, 64, 3, 4, 8), (128, 64, 64, 3, 8, 1),
          (128, 64, 64, 3, 8, 16), (128, 128, 64, 4, 8, 8), (64, 64, 64, 4, 4, 8), (128, 64, 128, 2, 8, 8),
          (128, 64, 128, 3, 8, 8), (256, 64, 64, 3, 8, 8), (64, 128, 64, 3, 4, 8), (128, 32, 64, 4, 4, 8)]
PLANS = [(128, 128, 64, 3, 8, 8), (128, 128, 64, 4, 8, 8), (128, 64, 64, 4, 4, 8), (128, 64, 64, 3, 8, 8),
         (64, 128, 64, 4, 4, 8), (128, 128, 32, 4, 8, 8), (64, 64, 64, 4, 4, 8), (128, 256, 64, 3, 8, 8)]


KINDS = ("tma",)


def main() -> None:
    torch.manual_seed(0)
    k, n = 1024, 3072
    dev = "cuda"
    tokens = [int(t) for t in (sys.argv[1] if len(sys.argv) > 1 else "512,2048,4096,8192,16384").split(",")]
    w = (torch.randn(2 * n, k, device=dev) * k ** -0.5).to(torch.bfloat16)
    print("| tokens | cuBLAS gate/up | silu_mul | pair | best pointer kernel | best TMA kernel | fused / pair | max err vs pair |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for m in tokens:
        x = torch.randn(m, k, device=dev).to(torch.bfloat16)
        gu = torch.empty(m, 2 * n, device=dev, dtype=torch.bfloat16)
        ref = silu_mul(x @ w.t())
        gemm = graph_us(lambda: torch.mm(x, w.t(), out=gu))
        act = graph_us(lambda: silu_mul(gu))
        pair = graph_us(lambda: silu_mul(torch.mm(x, w.t(), out=gu)))
        best = {}
        errors = []
        out = torch.empty(m, n, device=dev, dtype=torch.bfloat16)
        for kind in KINDS:
            for plan in (PLANS2 if kind == "tma" else PLANS):
                bm, bn, bk = plan[:3]
                try:
                    if kind == "ptr":
                        fn = lambda: run_ptr(x, w, out, plan)  # noqa: E731
                    else:
                        descs = (TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]),
                                 TensorDescriptor.from_tensor(out, [bm, bn]))
                        fn = lambda: run_tma(descs, m, n, k, plan)  # noqa: E731
                    out.zero_()
                    fn()
                    torch.cuda.synchronize()
                    err = (out.float() - ref.float()).abs().max().item() / ref.float().abs().max().item()
                    if err > 0.02:
                        print(f"  {kind} {plan} at {m}: error {err:.3g}, left out")
                        continue
                    us = graph_us(fn)
                except Exception as exc:  # a plan that does not compile or fit
                    print(f"  {kind} {plan} at {m}: {type(exc).__name__}: {str(exc)[:120]}")
                    continue
                print(f"  {kind} {plan} at {m}: {us:.1f} us, err {err:.2g}")
                errors.append(err)
                if kind not in best or us < best[kind][0]:
                    best[kind] = (us, plan)
        fused = min(v[0] for v in best.values()) if best else float("nan")
        print(f"| {m} | {gemm:.1f} | {act:.1f} | {pair:.1f} | "
              f"{best.get('ptr', (float('nan'), None))[0]:.1f} {best.get('ptr', (0, ''))[1]} | "
              f"{best.get('tma', (float('nan'), None))[0]:.1f} {best.get('tma', (0, ''))[1]} | "
              f"{fused / pair:.3f} | {max(errors) if errors else float('nan'):.2g} |")


if __name__ == "__main__":
    main()
