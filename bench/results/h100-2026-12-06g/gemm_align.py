"""GEMM time (GPU, CUDA graph of 10 calls) by row count M: multiples of 256 against odd counts beside them."""
import torch, torch.nn.functional as F
def gpu_us(fn, reps=10):
    for _ in range(3): fn()
    g = torch.cuda.CUDAGraph(); s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        with torch.cuda.graph(g):
            for _ in range(reps): fn()
    torch.cuda.synchronize(); e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    e0.record(); g.replay(); g.replay(); e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / (2 * reps) * 1e3
shapes = {"xlmr": [(1024, 3072), (1024, 1024), (1024, 4096), (4096, 1024)],
          "qwen3": [(1024, 4096), (2048, 1024), (1024, 6144), (3072, 1024)]}
Ms = [9216, 9215, 9217, 9300, 12544, 12543, 12600, 12800, 12801, 14080, 14111, 16128, 16127, 16200]
for name, prods in shapes.items():
    print(name, "M:", " ".join(f"{m:>6d}" for m in Ms), "(us per product summed over the layer's products, per 1000 rows)", flush=True)
    w = {p: (torch.randn(p[1], p[0], device="cuda", dtype=torch.bfloat16), torch.randn(p[1], device="cuda", dtype=torch.bfloat16)) for p in prods}
    line = []
    for m in Ms:
        total = 0.0
        for (k, n), (wt, b) in w.items():
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            total += gpu_us(lambda: F.linear(x, wt, b))
        line.append(total / m * 1000)
    print(" " * 8 + " ".join(f"{v:6.1f}" for v in line), flush=True)
