"""What an eager step above the graphs costs the first time its shape is met, against the same step again
(XLM-R large, the scorer's checkpoint, engine alone): rows of one length (dense, exact shape) and rows of
mixed lengths (padded to their token bucket); then cuDNN's dense attention and a product alone at new
shapes."""
import statistics, time
from pathlib import Path
import numpy as np, torch
import torch.nn.functional as F
from quiver.bench import score_bench as sb
from quiver.worker.engine import Batch, load_engine

root = Path("/tmp/ck-score")
model = sb.build_model("cuda", 0); path = sb.write_checkpoint(model, root); del model; torch.cuda.empty_cache()
engine = load_engine(path, device="cuda")
rng = np.random.default_rng(0)

def batch(lens):
    return Batch(input_ids=rng.integers(4, 999, sum(lens)).astype(np.int32), seq_lens=np.array(lens, np.int32),
                 normalize=np.zeros(len(lens), bool))

def timed(b):
    time.sleep(0.005)
    start = time.perf_counter(); lazy = engine.step(b); lazy.wait(); lazy.release()
    return (time.perf_counter() - start) * 1e3

print("| step | tokens | first sight ms | again, median of 3 ms |")
print("| --- | --- | --- | --- |")
cases = [("dense", [532] * n) for n in (17, 18, 19, 20, 21, 22, 26, 30)]
cases += [("mixed", [532] * (n - 1) + [300]) for n in (17, 19, 21, 23, 27)]
for kind, lens in cases:
    b = batch(lens)
    first = timed(b)
    again = statistics.median(timed(b) for _ in range(3))
    print(f"| {kind} {len(lens)} rows | {sum(lens)} | {first:.2f} | {again:.2f} |", flush=True)

def op_ms(fn):
    torch.cuda.synchronize(); start = time.perf_counter(); fn(); torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3

print("| op | shape | first call ms | again ms |")
print("| --- | --- | --- | --- |")
from torch.nn.attention import SDPBackend, sdpa_kernel
for n in (33, 34, 35):
    q = torch.randn(n, 16, 532, 64, device="cuda", dtype=torch.bfloat16)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        f = lambda: F.scaled_dot_product_attention(q, q, q)
        print(f"| cuDNN dense attention | {n} x 532 | {op_ms(f):.2f} | {op_ms(f):.2f} |", flush=True)
w = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
for m in (13001, 13002, 13003):
    x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
    f = lambda: F.linear(x, w)
    print(f"| F.linear 1024 -> 4096 | M = {m} | {op_ms(f):.2f} | {op_ms(f):.2f} |", flush=True)
