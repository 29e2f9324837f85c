"""Where an eager XLM-R-large step's GPU time goes: kernel time by op and shape, achieved TFLOP/s or GB/s."""
import statistics, time, sys
from pathlib import Path
import numpy as np, torch
import torch.nn.functional as F
from torch.profiler import profile, ProfilerActivity
from quiver.bench import score_bench as sb
from quiver.worker.engine import Batch, load_engine

model = sb.build_model("cuda", 0)
path = sb.write_checkpoint(model, Path("/tmp/ckpts"))
del model; torch.cuda.empty_cache()
rng = np.random.default_rng(0)
print(torch.cuda.get_device_name(), torch.__version__, flush=True)

def batch(lens):
    seqs = [rng.integers(4, 999, n).astype(np.int32) for n in lens]
    return Batch(input_ids=np.concatenate(seqs), seq_lens=np.array(lens, np.int32), normalize=np.zeros(len(lens), bool))

def timed(engine, b, label):
    launch, total = [], []
    for i in range(13):
        time.sleep(0.005)
        start = time.perf_counter(); lazy = engine.step(b); mid = time.perf_counter(); lazy.wait(); lazy.release()
        end = time.perf_counter()
        if i >= 3:
            launch.append((mid - start) * 1e3); total.append((end - start) * 1e3)
    print(f"{label}: {b.num_seqs} rows {b.num_tokens} tokens: launch {statistics.median(launch):.2f} ms, "
          f"step {statistics.median(total):.2f} ms, {b.num_tokens / statistics.median(total):.0f} tokens/ms", flush=True)

def dev(e):
    return getattr(e, "device_time_total", 0)

def kernel_table(engine, b, label):
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        lazy = engine.step(b); lazy.wait(); lazy.release()
    rows = []
    for e in prof.key_averages(group_by_input_shape=True):
        if e.key.startswith("aten::") or "attention" in e.key or "triton" in e.key.lower() or "_kernel" in e.key:
            t = dev(e)
            if t > 0:
                rows.append((t, e.key, e.count, str(e.input_shapes)[:70]))
    print(f"--- {label}: ops by device time (us total, count, shapes)", flush=True)
    for t, key, count, shapes in sorted(rows, reverse=True)[:22]:
        print(f"{t:9.0f} {count:4d} {t / count:8.1f}/call {key[:40]:40s} {shapes}", flush=True)
    kern = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    total = sum(e.device_time for e in kern) if kern and hasattr(kern[0], "device_time") else None
    print(f"kernels {len(kern)}, summed kernel time {total} us", flush=True)
    names = {}
    for e in kern:
        k = e.name[:60]
        names.setdefault(k, [0, 0.0]); names[k][0] += 1; names[k][1] += getattr(e, "device_time", 0)
    for k, (c, t) in sorted(names.items(), key=lambda kv: -kv[1][1])[:16]:
        print(f"   {t:9.0f} us {c:4d}x  {k}", flush=True)

equal = batch([532] * 30)
mixed = batch(list(rng.integers(120, 533, 44)))
print("mixed tokens", mixed.num_tokens, flush=True)
engine = load_engine(path, device="cuda")
print("backends", engine.info.attention_backends, getattr(engine, "ops", None) and engine.ops.mode, flush=True)
for label, b in (("equal", equal), ("mixed", mixed)):
    timed(engine, b, label)
    kernel_table(engine, b, label)
small = batch([532] * 14)
timed(engine, small, "graph 14x532")
del engine; torch.cuda.empty_cache()

print("--- GEMMs alone (M, K, N): ms, TFLOP/s; F.linear with bias / mm without / cublas lib with bias", flush=True)
def bench(fn, reps=30):
    for _ in range(5): fn()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    torch.cuda.synchronize(); s.record()
    for _ in range(reps): fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / reps
for m in (15960, 7448):
    for k, n in ((1024, 3072), (1024, 1024), (1024, 4096), (4096, 1024)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16); w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        out = []
        torch.backends.cuda.preferred_blas_library("cublaslt")
        out.append(bench(lambda: F.linear(x, w, bias)))
        out.append(bench(lambda: torch.mm(x, w.t())))
        torch.backends.cuda.preferred_blas_library("cublas")
        out.append(bench(lambda: F.linear(x, w, bias)))
        torch.backends.cuda.preferred_blas_library("cublaslt")
        fl = 2 * m * k * n / 1e9
        print(f"{m:6d} {k:5d} {n:5d}: " + "  ".join(f"{t:.3f} ms {fl / t:.0f}" for t in out), flush=True)
exec(open(".devrun/addmm_probe.py").read())
