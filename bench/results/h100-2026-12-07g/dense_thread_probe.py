"""Can a second thread own the cuDNN dense-attention plans? XLM-R large (scorer shape), engine alone.
A: plan built on thread T, then the same shape on the main thread (thread_local?) and on T again.
B: main thread's padded steps timed while T builds five plans (interference).
C: on T, attention-only warm of a dense shape, then the whole dense step on T: first vs again;
   control: a dense step on T with no warm. D: cuBLAS product at a new M on T, then on main."""
import statistics, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
import numpy as np, torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from quiver.bench import score_bench as sb
from quiver.worker.engine import Batch, load_engine
from quiver.worker.engine.buckets import plan_shape

root = Path("/tmp/ck-score")
model = sb.build_model("cuda", 0); path = sb.write_checkpoint(model, root); del model; torch.cuda.empty_cache()
engine = load_engine(path, device="cuda")
rng = np.random.default_rng(0)
T = ThreadPoolExecutor(1)
T.submit(torch.cuda.set_device, 0).result()

def on_t(fn):
    return T.submit(fn).result()

def batch(lens):
    return Batch(input_ids=rng.integers(4, 999, sum(lens)).astype(np.int32), seq_lens=np.array(lens, np.int32),
                 normalize=np.zeros(len(lens), bool))

def op_ms(fn):
    torch.cuda.synchronize(); start = time.perf_counter(); fn(); torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3

def attn(n):
    q = torch.randn(n, 16, 532, 64, device="cuda", dtype=torch.bfloat16)
    def run():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(q, q, q)
    return run

print("| A: cuDNN dense attention n x 532 | built on T ms | then main ms | then T again ms | main again ms |")
for n in (23, 24):
    f = attn(n)
    a = on_t(lambda: op_ms(f)); b = op_ms(f); c = on_t(lambda: op_ms(f)); d = op_ms(f)
    print(f"| {n} | {a:.2f} | {b:.2f} | {c:.2f} | {d:.2f} |", flush=True)

def step_ms(b):
    start = time.perf_counter(); lazy = engine.step(b); lazy.wait(); lazy.release()
    return (time.perf_counter() - start) * 1e3

mixed = [batch([532] * 20 + [300]) for _ in range(3)]
for b in mixed: step_ms(b)
before = [step_ms(mixed[i % 3]) for i in range(20)]
def build_five():
    t0 = time.perf_counter()
    for n in (40, 41, 42, 43, 44):
        attn(n)(); torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3
fut = T.submit(build_five)
during = []
while not fut.done():
    during.append(step_ms(mixed[len(during) % 3]))
built = fut.result()
after = [step_ms(mixed[i % 3]) for i in range(20)]
q = lambda xs: f"{statistics.median(xs):.2f} / {max(xs):.2f} (n={len(xs)})"
print(f"B: padded 21-row steps on main, median / max ms: before {q(before)}; while T built 5 plans in {built:.0f} ms: {q(during)}; after {q(after)}", flush=True)

def dense_on_t(lens):
    b = batch(lens)
    shape = plan_shape(b.seq_lens, engine.graph_limits)
    assert shape.dense_len and not shape.graphable, shape
    def run():
        with torch.inference_mode(), torch.cuda.stream(engine.stream):
            torch.cuda.synchronize(); start = time.perf_counter()
            tensors = engine.upload(b, shape)
            engine.forward_step(shape, tensors)
            torch.cuda.synchronize()
            return (time.perf_counter() - start) * 1e3
    return on_t(run)

print("| C: dense step on T, rows of 532 | warm attention only (ms) | first step ms | again ms (median of 3) |")
for n in (25, 19):
    w = on_t(lambda: op_ms(attn(n)))
    first = dense_on_t([532] * n); again = statistics.median(dense_on_t([532] * n) for _ in range(3))
    print(f"| {n} | {w:.2f} | {first:.2f} | {again:.2f} |", flush=True)
for n in (27, 29):
    first = dense_on_t([532] * n); again = statistics.median(dense_on_t([532] * n) for _ in range(3))
    print(f"| {n} (no warm, control) | - | {first:.2f} | {again:.2f} |", flush=True)

w = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16)
print("| D: F.linear 1024->4096 at new M | on T first ms | then main ms | main again |")
for m in (13007, 13013):
    x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
    f = lambda: F.linear(x, w)
    a = on_t(lambda: op_ms(f)); b = op_ms(f); c = op_ms(f)
    print(f"| {m} | {a:.2f} | {b:.2f} | {c:.2f} |", flush=True)
