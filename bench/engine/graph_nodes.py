"""What an engine step's CUDA graph holds, and whether launching it delays the GPU.

    python -m quiver.bench.engine.graph_nodes [--models qwen3-0.6b-bidirectional-mean,xlmr-large-cls]
        [--tokens 128,512,2048,4096] [--ckpt-dir DIR] [--out FILE]

For one sequence of each token count, the step is captured as the engine captures it and the graph's nodes
are counted by type and by kernel name (the CUDA driver's graph API). Then, timed:
- replay() CPU: how long the call takes on the host, the GPU idle;
- single: the GPU's time from an event recorded just before replay() to one recorded just after it, with
  the GPU idle 2 ms before; it includes any wait for the launch to reach the GPU;
- back to back: GPU time per replay over 20 replays in a row.
Single minus back to back is the launch delay the GPU sees, where the clocks hold: a long graph replayed
back to back may run at lower clocks than after an idle gap (the power limit), making it negative.
Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

NODE_TYPES = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "child graph", 5: "empty", 6: "event wait",
              7: "event record", 10: "alloc", 11: "free", 13: "conditional"}


class _KernelNodeParams(ctypes.Structure):
    """CUDA_KERNEL_NODE_PARAMS_v2 (cuda.h)."""

    _fields_ = [("func", ctypes.c_void_p), ("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared_bytes", ctypes.c_uint), ("params", ctypes.c_void_p), ("extra", ctypes.c_void_p),
                ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


@dataclass
class NodeSummary:
    types: collections.Counter[str] = field(default_factory=collections.Counter)
    kernels: collections.Counter[str] = field(default_factory=collections.Counter)

    @property
    def count(self) -> int:
        return sum(self.types.values())


def _kernel_name(driver: ctypes.CDLL, node: int) -> str:
    params = _KernelNodeParams()
    name = ctypes.c_char_p()
    if driver.cuGraphKernelNodeGetParams_v2(ctypes.c_void_p(node), ctypes.byref(params)) == 0:
        if params.func:
            driver.cuFuncGetName(ctypes.byref(name), ctypes.c_void_p(params.func))
        elif params.kern:
            driver.cuKernelGetName(ctypes.byref(name), ctypes.c_void_p(params.kern))
    return (name.value or b"?").decode(errors="replace")


def node_summary(graph: torch.cuda.CUDAGraph) -> NodeSummary:
    """The nodes of a graph captured with keep_graph=True, by type and (kernels) by name."""
    driver = ctypes.CDLL("libcuda.so.1")
    handle = ctypes.c_void_p(graph.raw_cuda_graph())
    count = ctypes.c_size_t(0)
    if driver.cuGraphGetNodes(handle, None, ctypes.byref(count)) != 0:
        raise RuntimeError("cuGraphGetNodes failed")
    nodes = (ctypes.c_void_p * count.value)()
    driver.cuGraphGetNodes(handle, nodes, ctypes.byref(count))
    summary = NodeSummary()
    for node in nodes:
        kind = ctypes.c_int()
        driver.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(kind))
        summary.types[NODE_TYPES.get(kind.value, f"type {kind.value}")] += 1
        if kind.value == 0:
            summary.kernels[_kernel_name(driver, node)] += 1
    return summary


def launch_times(graph: torch.cuda.CUDAGraph, samples: int = 40) -> dict[str, float]:
    """replay() CPU ms, single-replay GPU ms after an idle gap, back-to-back GPU ms (module docstring)."""
    cpu, single = [], []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        time.sleep(0.002)
        start.record()
        began = time.perf_counter()
        graph.replay()
        cpu.append((time.perf_counter() - began) * 1e3)
        end.record()
        end.synchronize()
        single.append(start.elapsed_time(end))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        graph.replay()
    end.record()
    end.synchronize()
    back_to_back = start.elapsed_time(end) / 20
    return {"replay_cpu_ms": float(np.median(cpu)), "single_ms": float(np.median(single)),
            "back_to_back_ms": back_to_back, "launch_delay_ms": float(np.median(single)) - back_to_back}


def probe_step(engine: Any, tokens: int) -> dict[str, Any]:
    from quiver.worker.engine.buckets import plan_shape
    from quiver.worker.engine.engine import synthetic_batch

    batch = synthetic_batch(tokens, tokens, engine.info.model.vocab_size, 0)
    shape = plan_shape(batch.seq_lens, engine.graph_limits)
    with torch.inference_mode(), torch.cuda.stream(engine.stream):
        tensors = engine.upload(batch, shape)
        engine.forward_step(shape, tensors)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            engine.forward_step(shape, tensors)
        graph.instantiate()
        nodes = node_summary(graph)
        graph.replay()
        row = {"tokens": tokens, "nodes": nodes.count, "types": dict(nodes.types),
               "kernels": dict(nodes.kernels.most_common()), **launch_times(graph)}
    del graph
    return row


def main() -> None:
    from quiver.bench.engine.checkpoints import ensure_bench_checkpoint
    from quiver.worker.engine import load_engine

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="qwen3-0.6b-bidirectional-mean,xlmr-large-cls")
    parser.add_argument("--tokens", default="128,512,2048,4096")
    parser.add_argument("--ckpt-dir", default="/tmp/quiver-bench-ckpts")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    print(torch.cuda.get_device_name())
    print("| model | tokens | nodes (kernels, memsets, other) | replay() CPU ms | single ms | back to back ms | "
          "launch delay ms |")
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "models": {}}
    for name in args.models.split(","):
        engine = load_engine(ensure_bench_checkpoint(name, Path(args.ckpt_dir)), device="cuda")
        rows = [probe_step(engine, int(tokens)) for tokens in args.tokens.split(",")]
        for row in rows:
            kernels, memsets = row["types"].get("kernel", 0), row["types"].get("memset", 0)
            print(f"| {name} | {row['tokens']} | {row['nodes']} ({kernels}, {memsets}, "
                  f"{row['nodes'] - kernels - memsets}) | {row['replay_cpu_ms']:.3f} | {row['single_ms']:.3f} | "
                  f"{row['back_to_back_ms']:.3f} | {row['launch_delay_ms']:.3f} |", flush=True)
        result["models"][name] = rows
        del engine
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
