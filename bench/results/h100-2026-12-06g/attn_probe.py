"""Ragged attention: FlashAttention-2 (aten) against cuDNN's ragged (THD) path, GPU time and host time of new shapes."""
import statistics, time
import numpy as np, torch
import torch.nn.functional as F
torch.manual_seed(0)
rng = np.random.default_rng(0)
dev = "cuda"

def cu_of(lens):
    c = np.zeros(len(lens) + 1, np.int32); c[1:] = np.cumsum(lens); return torch.tensor(c, device=dev)

def fa2(q, k, v, cu, m, causal=False):
    return torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, m, m, 0.0, causal, False, scale=q.shape[-1] ** -0.5)[0]

def cudnn(q, k, v, cu, m, causal=False):
    g = q.shape[1] // k.shape[1]
    if g > 1:
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()  # its ragged offsets assume packed rows
    return torch.ops.aten._cudnn_attention_forward(q, k, v, None, cu, cu, m, m, False, 0.0, causal, False,
                                                   scale=q.shape[-1] ** -0.5)[0]

def reference(q, k, v, lens, causal=False):
    outs, o = [], 0
    g = q.shape[1] // k.shape[1]
    for n in lens:
        if n == 0: continue
        qq, kk, vv = (x[o:o + n].float().transpose(0, 1) for x in (q, k, v))
        kk, vv = kk.repeat_interleave(g, 0), vv.repeat_interleave(g, 0)
        outs.append(F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal).transpose(0, 1)); o += n
    return torch.cat(outs)

def gpu_ms(fn, reps=20):
    for _ in range(3): fn()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        with torch.cuda.graph(g):
            for _ in range(reps): fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    e0.record(); g.replay(); e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / reps * 1e3

def flops(lens, h, d):
    return sum(4 * n * n * d * h for n in lens)

mixed = list(rng.integers(120, 533, 44))
cases = [
    ("xlmr 30x532 equal (ragged path)", 16, 16, 64, [532] * 30, 532),
    ("xlmr mixed 44 rows 120-532", 16, 16, 64, mixed, max(mixed)),
    ("xlmr graph 14x532+232, 32 rows, max 7680", 16, 16, 64, [532] * 14 + [232] + [0] * 17, 7680),
    ("xlmr graph 5x532+156, 8 rows, max 2816", 16, 16, 64, [532] * 5 + [156] + [0] * 2, 2816),
    ("xlmr 64x128 + dummy, 128 rows, max 512", 16, 16, 64, [128] * 63 + [64] + [0] * 64, 512),
    ("qwen3 mixed 44 rows 120-532 (GQA 16/8)", 16, 8, 128, mixed, max(mixed)),
    ("qwen3 16x512 equal, 32 rows max 512", 16, 8, 128, [512] * 16 + [0] * 16, 512),
    ("qwen3 1x4096", 16, 8, 128, [4096], 4096),
]
print(f"{'case':48s} {'fa2 us':>8s} {'cudnn us':>9s} {'fa2 TF':>7s} {'cudnn TF':>8s} {'err fa2':>8s} {'err cudnn':>9s}", flush=True)
for name, h, hkv, d, lens, m in cases:
    t = int(sum(lens))
    fused = torch.randn(t, (h + 2 * hkv) * d, device=dev, dtype=torch.bfloat16)  # views, as the models make them
    q, k, v = (part.view(t, n, d) for part, n in zip(fused.split([h * d, hkv * d, hkv * d], -1), (h, hkv, hkv)))
    cu = cu_of(lens)
    ref = reference(q, k, v, lens)
    row = []
    errs = []
    for fn in (fa2, cudnn):
        try:
            out = fn(q, k, v, cu, m)
            torch.cuda.synchronize()
            errs.append(float((out.float() - ref).norm() / ref.norm()))
            row.append(gpu_ms(lambda: fn(q, k, v, cu, m)))
        except Exception as exc:
            errs.append(float("nan")); row.append(float("nan"))
            print(f"  {fn.__name__} failed: {str(exc)[:160]}", flush=True)
    fl = flops(lens, h, d)
    print(f"{name:48s} {row[0]:8.1f} {row[1]:9.1f} {fl / row[0] / 1e6:7.0f} {fl / row[1] / 1e6:8.0f} {errs[0]:8.4f} {errs[1]:9.4f}", flush=True)

print("--- host time of a call at a shape not seen before, then seen (us)", flush=True)
for fn in (fa2, cudnn):
    new, seen = [], []
    for i in range(12):
        lens = list(rng.integers(100, 533, int(rng.integers(20, 40))))
        t = int(sum(lens)); m = max(lens)
        q = torch.randn(t, 16, 64, device=dev, dtype=torch.bfloat16); k = torch.randn_like(q); v = torch.randn_like(q)
        cu = cu_of(lens); torch.cuda.synchronize()
        s = time.perf_counter(); fn(q, k, v, cu, m); new.append((time.perf_counter() - s) * 1e6); torch.cuda.synchronize()
        s = time.perf_counter(); fn(q, k, v, cu, m); seen.append((time.perf_counter() - s) * 1e6); torch.cuda.synchronize()
    print(f"{fn.__name__}: new shape {statistics.median(new):8.0f}, seen {statistics.median(seen):6.0f}", flush=True)
