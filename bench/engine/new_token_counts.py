"""Steps at token counts the engine has not run before: their host launch and the stream's throughput.

    python -m quiver.bench.engine.new_token_counts [--steps 60] [--requests 60] [--passes 2] [--models A,B]
        [--out FILE] [--root DIR]

A step above the CUDA graphs, and every token-row step (BGE-M3's outputs), runs eagerly, and cuBLAS
chooses an algorithm on the host for each product shape it has not met. This runs, on random weights of
the real shapes (bf16, one device):
- for the pplx-embed-0.6B (Qwen3) and BGE-M3 / bge-reranker-v2-m3 (XLM-R large) shapes, a stream of
  unequal-row steps of 8,193-16,384 tokens (rows of 64-512 tokens), launched two deep as the worker's
  scheduler launches them: the median host launch per step and the stream's tokens per ms;
- BGE-M3's sparse output alone (token rows cut to their weight) at batch 1, rows of 60-300 tokens, one
  request at a time: p50 / p99 ms.
Each runs over the same inputs --passes times: first sight, then again, when every shape has been met
once. The attention backend each step's shape was given is counted (the engine's attention_choices).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from quiver.bench.engine.checkpoints import ensure_bench_checkpoint
from quiver.bench.engine_bench import launch_two_deep, one_batch, percentiles, random_ids
from quiver.bench.token_outputs_bench import token_batch, with_m3_heads
from quiver.worker.engine import Batch, Engine, load_engine

VOCAB = 30000


def unequal_steps(rng: np.random.Generator, count: int, max_tokens: int) -> list[Batch]:
    """count batches of rows of 64-512 tokens, each filled up to a random target of 8,704 to max_tokens
    tokens (so more than 8,192, the largest graph, in all)."""
    batches = []
    for _ in range(count):
        target = int(rng.integers(8704, max_tokens + 1))
        lens: list[int] = []
        while True:
            length = int(rng.integers(64, 513))
            if sum(lens) + length > target:
                break
            lens.append(length)
        batches.append(one_batch([random_ids(rng, n, VOCAB) for n in lens]))
    return batches


def stream(engine: Engine, batches: list[Batch]) -> dict[str, float]:
    """Launch each step, then wait for the one before it (two in flight, as the scheduler runs them)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    launches = launch_two_deep(engine, batches)
    elapsed_ms = (time.perf_counter() - start) * 1e3
    tokens = sum(batch.num_tokens for batch in batches)
    return {"launch_p50_ms": round(statistics.median(launches), 2), "tokens_per_ms": round(tokens / elapsed_ms, 1),
            "steps": len(batches), "tokens": tokens}


def lexical_latency(engine: Engine, requests: list[np.ndarray]) -> dict[str, float]:
    samples = []
    for ids in requests:
        batch = token_batch([ids], lexical_only=True)
        start = time.perf_counter()
        engine.step(batch).wait()
        samples.append((time.perf_counter() - start) * 1e3)
    return percentiles(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--models", default="qwen3-0.6b-bidirectional-mean,xlmr-large-cls")
    parser.add_argument("--root", type=Path, default=Path("/tmp/quiver-bench-ckpts"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(0)}
    rng = np.random.default_rng(0)
    for name in args.models.split(","):
        path = ensure_bench_checkpoint(name, args.root)
        bge_m3 = name.startswith("xlmr")  # XLM-R large with BGE-M3's heads: its token rows are timed too
        if bge_m3:
            path = with_m3_heads(path, args.root, hidden=1024)
        engine = load_engine(path, device="cuda")
        batches = unequal_steps(rng, args.steps, engine.info.max_batch_tokens)
        results[name] = {"first_sight": stream(engine, batches)}
        results[name].update({f"again_{i}": stream(engine, batches) for i in range(1, args.passes)})
        results[name]["attention_choices"] = engine.stats()["attention_choices"]
        if bge_m3 and args.requests:
            requests = [random_ids(rng, int(rng.integers(60, 301)), VOCAB) for _ in range(args.requests)]
            results["bge-m3-lexical-batch-1"] = {"first_sight": lexical_latency(engine, requests)}
            results["bge-m3-lexical-batch-1"].update(
                {f"again_{i}": lexical_latency(engine, requests) for i in range(1, args.passes)})
        del engine
        torch.cuda.empty_cache()
        print(json.dumps({key: value for key, value in results.items() if key != "device"}, indent=1), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
