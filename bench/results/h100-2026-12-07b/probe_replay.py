"""A graph's first replay against later ones: the engine's own steps after its full start-up, and graphs
captured here and never launched (pplx shape)."""
import sys, time
import logging
import numpy as np, torch
logging.basicConfig(level=logging.INFO)
from quiver.worker.engine import Batch, load_engine
from quiver.worker.engine.buckets import plan_shape

engine = load_engine(sys.argv[1], device="cuda")
rng = np.random.default_rng(1)
def batch(lens):
    lens = np.array(lens, dtype=np.int32)
    return Batch(input_ids=rng.integers(3, 1000, size=int(lens.sum()), dtype=np.int32), seq_lens=lens)
print("engine.step wall ms: first, then the next five")
for lens in ([128], [512], [300], [4096], [512, 512], [128] * 7, [2000, 100, 40]):
    b = batch(lens)
    walls = []
    for i in range(6):
        torch.cuda.synchronize(); time.sleep(0.002)
        t = time.perf_counter()
        lt = engine.step(b); lt.wait(); lt.release()
        walls.append((time.perf_counter() - t) * 1e3)
    print(f"{str(lens)[:26]:26s} " + " ".join(f"{w:7.3f}" for w in walls))
print("a graph captured here, never launched: replay() host ms / GPU ms, launches 1 / 2 / 3")
for lens in ([128], [512], [4096], [128] * 7):
    b = batch(lens)
    shape = plan_shape(b.seq_lens, engine.graph_limits)
    with torch.inference_mode(), torch.cuda.stream(engine.stream):
        tensors = engine.upload(b, shape)
        engine.forward_step(shape, tensors)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, capture_error_mode="thread_local"):
            engine.forward_step(shape, tensors)
        row = []
        for i in range(3):
            torch.cuda.synchronize(); time.sleep(0.002)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t = time.perf_counter(); s.record(); g.replay(); h = (time.perf_counter() - t) * 1e3; e.record()
            e.synchronize(); row.append(f"{h:6.3f} / {s.elapsed_time(e):6.3f}")
    print(f"{str(lens)[:26]:26s} " + "   ".join(row))
