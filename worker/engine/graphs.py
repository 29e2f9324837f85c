"""Lazily captured CUDA graphs, one per step shape, sharing one memory pool.

The first time a graphable shape is seen the step runs eagerly (warm-up: kernels compile, the attention
backend is measured, cuBLAS picks its algorithms); the second time it is captured and replayed; after
that it is only replayed. All graphs read the same static input buffer (filled in place before each
step) and allocate from one pool, so they share activation memory: steps run one at a time on one
stream, and each graph's output buffer stays alive while its intermediates are reused by the next.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch

from quiver.worker.engine.buckets import StepShape

log = logging.getLogger("quiver.engine")


@dataclass
class CapturedGraph:
    graph: torch.cuda.CUDAGraph
    output: torch.Tensor


@dataclass
class GraphCounters:
    warmups: int = 0
    captures: int = 0
    replays: int = 0
    eager_steps: int = 0
    capture_failures: int = 0


class GraphRunner:
    def __init__(self, device: torch.device, enabled: bool) -> None:
        self.device = device
        self.enabled = enabled and device.type == "cuda"
        self.pool = torch.cuda.graph_pool_handle() if self.enabled else None
        self.graphs: dict[StepShape, CapturedGraph] = {}
        self.seen: set[StepShape] = set()
        self.eager_only: set[StepShape] = set()  # shapes whose capture failed
        self.counters = GraphCounters()
        self.pool_bytes = 0

    def run(self, shape: StepShape, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Run forward for this shape: eagerly, by capture then replay, or by replay."""
        if not (self.enabled and shape.graphable) or shape in self.eager_only:
            self.counters.eager_steps += 1
            return forward()
        captured = self.graphs.get(shape)
        if captured is None:
            if shape not in self.seen:
                self.seen.add(shape)
                self.counters.warmups += 1
                return forward()
            try:
                captured = self._capture(shape, forward)
            except Exception as exc:  # noqa: BLE001 - keep serving eagerly, loudly
                log.warning("CUDA graph capture failed for %s, running it eagerly from now on: %s", shape, exc)
                self.counters.capture_failures += 1
                self.eager_only.add(shape)
                self.counters.eager_steps += 1
                return forward()
        captured.graph.replay()
        self.counters.replays += 1
        return captured.output

    def _capture(self, shape: StepShape, forward: Callable[[], torch.Tensor]) -> CapturedGraph:
        reserved = torch.cuda.memory_reserved(self.device)
        graph = torch.cuda.CUDAGraph()
        # thread_local: other threads (readers waiting on result events) may use CUDA meanwhile.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            output = forward()
        self.pool_bytes += max(0, torch.cuda.memory_reserved(self.device) - reserved)
        self.counters.captures += 1
        captured = CapturedGraph(graph, output)
        self.graphs[shape] = captured
        log.debug("captured a CUDA graph for %s (%d graphs)", shape, len(self.graphs))
        return captured


def time_with_graph(forward: Callable[[], torch.Tensor], repeats: int = 20) -> float:
    """Milliseconds per replay of forward captured in a throw-away graph (forward must be warmed up)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        forward()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        graph.replay()
    end.record()
    end.synchronize()
    del graph
    return start.elapsed_time(end) / repeats
