"""Eager against graph steps for equal 532-token rows, and where an eager step's host launch goes."""
import statistics, time
from pathlib import Path
import numpy as np, torch
from quiver.bench import score_bench as sb
from quiver.worker.engine import Batch, load_engine

model = sb.build_model("cuda", 0)
path = sb.write_checkpoint(model, Path("/tmp/ckpts"))
del model; torch.cuda.empty_cache()
rng = np.random.default_rng(0)

def batch(rows):
    seqs = [rng.integers(4, 999, 532).astype(np.int32) for _ in range(rows)]
    return Batch(input_ids=np.concatenate(seqs), seq_lens=np.full(rows, 532, np.int32), normalize=np.zeros(rows, bool))

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

batches = {rows: batch(rows) for rows in (6, 15, 22)}
for gmax in (8192, 4096):
    engine = load_engine(path, device="cuda", graph_max_tokens=gmax)
    for rows, b in batches.items():
        timed(engine, b, f"graph max {gmax}")
    if gmax == 4096:
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            lazy = engine.step(batches[22]); lazy.wait(); lazy.release()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14), flush=True)
    del engine; torch.cuda.empty_cache()
