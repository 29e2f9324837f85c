"""Where the GPU time of one engine step goes: kernel times by name, graph replay, and eager steps back to back.

    python -m quiver.bench.engine.profile_kernels --ckpt-dir DIR [--shapes 1x128,1x4096,32x512] [--fusion auto,triton]

For each benchmark checkpoint, fusion mode and step shape (sequences x tokens each), runs the step eagerly
under the PyTorch profiler and prints the kernels' summed device time per step; then, for shapes the
graphs cover, the same step's CUDA-graph replay time (the difference is what launch gaps cost inside the
graph), and for every shape the wall time per step of eager steps launched two in flight through
engine.step, as throughput runs and large served steps run (above the kernel sum: the GPU waited for the
host).
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


def stepped_ms(engine: Engine, batch: Batch, steps: int = 12) -> tuple[float, float]:
    """(wall ms per step, ms for step() to return) over `steps` steps kept two in flight, after two warm-ups."""
    for _ in range(2):
        engine.step(batch).wait()
    in_flight, launches = [], []
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        launched = time.perf_counter()
        in_flight.append(engine.step(batch))
        launches.append((time.perf_counter() - launched) * 1e3)
        if len(in_flight) == 2:
            lazy = in_flight.pop(0)
            lazy.wait()
            lazy.release()
    for lazy in in_flight:
        lazy.wait()
        lazy.release()
    return (time.perf_counter() - start) * 1e3 / steps, float(np.median(launches))


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """"1x128,32x512" -> [(1, 128), (32, 512)]: sequences x tokens each."""
    return [(int(count), int(length)) for count, length in (item.split("x") for item in text.split(","))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt-dir", default="/tmp/quiver-bench-ckpts")
    parser.add_argument("--shapes", default="1x128,1x4096", help="step shapes, sequences x tokens each")
    parser.add_argument("--fusion", default="auto", help="fusion modes to load, comma-separated")
    parser.add_argument("--blas", default="", help="BLAS libraries to run the eager steps with, comma-separated "
                        "(cublas, cublaslt; default: the one start-up chose)")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    for name in BENCH_MODELS:
        path = Path(args.ckpt_dir) / name
        if not path.is_dir():
            continue
        for fusion in args.fusion.split(","):
            engine = load_engine(path, device="cuda", fusion=fusion)
            print(f"\n== {name}, fusion {fusion} (chosen: {engine.info.fusion}), graphs up to "
                  f"{engine.info.graph_max_tokens} tokens, attention {engine.info.attention_backends}")
            for count, length in parse_shapes(args.shapes):
                rng = np.random.default_rng(count * length)
                batch = Batch(input_ids=rng.integers(3, 30000, size=count * length, dtype=np.int32),
                              seq_lens=np.full(count, length, dtype=np.int32))
                graphed = count * length <= engine.info.graph_max_tokens
                for blas in args.blas.split(",") if args.blas and not graphed else [engine.info.blas]:
                    torch.backends.cuda.preferred_blas_library(blas)
                    busy, rows = kernel_table(engine, batch)
                    wall, launch = stepped_ms(engine, batch)
                    line = (f"\n{name} [{fusion}, {blas}], {count} x {length} tokens: kernels {busy:.3f} ms/step, "
                            f"engine.step two in flight {wall:.3f} ms/step (step() returns in {launch:.3f} ms)")
                    if graphed:
                        gpu, cpu = replay_ms(engine, batch)
                        line += f", graph replay {gpu:.3f} ms, replay() call on the CPU {cpu:.3f} ms"
                    print(line)
                    for kernel, ms, calls in rows[: args.top]:
                        print(f"  {ms:8.3f} ms  x{calls:<4d} {kernel}")
                torch.backends.cuda.preferred_blas_library(engine.info.blas)
            del engine
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
