"""Where the GPU time of one engine step goes: kernel times by name, and graph replay time.

    python -m quiver.bench.engine.profile_kernels --ckpt-dir DIR [--tokens 128,4096]

For each benchmark checkpoint and token count (one sequence), runs the step eagerly under the PyTorch
profiler and prints the kernels' summed device time per step, then the same step's CUDA-graph replay
time: the difference is what launch gaps cost inside the graph.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from quiver.bench.engine.checkpoints import BENCH_MODELS
from quiver.worker.engine import Batch, Engine, load_engine
from quiver.worker.engine.buckets import plan_shape
from quiver.worker.engine.graphs import time_with_graph


def kernel_table(engine: Engine, batch: Batch, steps: int = 3) -> tuple[float, list[tuple[str, float, int]]]:
    for _ in range(2):
        engine.run_eager(batch)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            engine.run_eager(batch)
        torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.device_time > 0:
            name = event.name[:90]
            totals[name] += event.device_time / steps / 1e3
            counts[name] += 1
    rows = sorted(((n, t, counts[n] // steps) for n, t in totals.items()), key=lambda r: -r[1])
    return sum(totals.values()), rows


def replay_ms(engine: Engine, batch: Batch) -> tuple[float, float]:
    """(GPU ms per replay back to back, CPU ms that one replay() call takes with the GPU idle)."""
    shape = plan_shape(batch.seq_lens, engine.graph_limits)
    with torch.inference_mode(), torch.cuda.stream(engine.stream):
        tensors = engine.upload(batch, shape)
        engine.forward_step(shape, tensors)
        gpu = time_with_graph(lambda: engine.forward_step(shape, tensors), repeats=20)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            engine.forward_step(shape, tensors)
        launches = []
        for _ in range(30):
            torch.cuda.synchronize()
            start = time.perf_counter()
            graph.replay()
            launches.append((time.perf_counter() - start) * 1e3)
        torch.cuda.synchronize()
    return gpu, float(np.median(launches))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt-dir", default="/tmp/quiver-bench-ckpts")
    parser.add_argument("--tokens", default="128,4096")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    for name in BENCH_MODELS:
        path = Path(args.ckpt_dir) / name
        if not path.is_dir():
            continue
        engine = load_engine(path, device="cuda")
        for tokens in (int(t) for t in args.tokens.split(",")):
            ids = np.random.default_rng(tokens).integers(3, 30000, size=tokens, dtype=np.int32)
            batch = Batch(input_ids=ids, seq_lens=np.array([tokens], dtype=np.int32))
            busy, rows = kernel_table(engine, batch)
            gpu, launch = replay_ms(engine, batch)
            print(f"\n{name}, 1 x {tokens} tokens: kernels {busy:.3f} ms/step, graph replay {gpu:.3f} ms, "
                  f"replay() call on the CPU {launch:.3f} ms")
            for kernel, ms, count in rows[: args.top]:
                print(f"  {ms:8.3f} ms  x{count:<4d} {kernel}")
        del engine
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
