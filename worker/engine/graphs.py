"""CUDA graphs, one per graph shape (buckets.graph_shapes) and forward (sequence rows, or BGE-M3's token
rows), captured at start-up, sharing one memory pool (a fresh one after a failed capture: GraphPool).

capture() runs a shape once eagerly (kernels compile, cuBLAS picks its algorithms) and then captures it;
startup.capture_graphs does that for every shape before the worker says it is ready. run() only ever
replays: a step whose shape has no graph (larger than the graph limit, or a capture that failed) runs
eagerly, and nothing is captured on a request's path. All graphs read the same static input buffer
(filled in place before each step) and allocate from one pool, so they share activation memory: steps
run one at a time on one stream, and each graph's output buffer stays alive while its intermediates are
reused by the next.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from quiver.worker.engine.buckets import StepShape, first_sight_key

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
    eager_new_shapes: int = 0  # eager steps at a shape not run eagerly before (see GraphRunner.run)
    eager_warmups: int = 0  # eager shapes set up off the requests' path: at start-up, or dense ones (GraphRunner.warm)
    capture_failures: int = 0


class GraphPool:
    """The memory pool the graphs of one engine capture into (steps run one at a time on one stream, so
    they may share activation memory), and the pools given up before it.

    A failed capture can leave the allocator routing to its pool, and then every later capture into that
    pool fails ("beginAllocateToPool: already recording to mempool_id"; on an H100 it did even after
    capturing() ended the routing, bench/RESULTS.md, 2026-12-07, last), so the next capture takes a fresh
    pool: the graphs captured after a failure do not share memory with those before it."""

    def __init__(self) -> None:
        self.handles = [torch.cuda.graph_pool_handle()]

    @property
    def current(self) -> Any:
        return self.handles[-1]

    def renew(self) -> None:
        self.handles.append(torch.cuda.graph_pool_handle())


class GraphRunner:
    """The graphs of one forward function (an embedder's rows, or its token rows), keyed by step shape;
    pool: another runner's GraphPool to share."""

    def __init__(self, device: torch.device, enabled: bool, pool: GraphPool | None = None) -> None:
        self.device = device
        self.enabled = enabled and device.type == "cuda"
        self.pool = (pool or GraphPool()) if self.enabled else None
        self.graphs: dict[StepShape, CapturedGraph] = {}
        self.eager_shapes: set[tuple[int, int, int]] = set()  # first_sight_key of every shape run eagerly
        self.counters = GraphCounters()

    def run(self, shape: StepShape, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Replay this shape's graph, or run forward eagerly when it has none.

        An eager step at a shape not run before (buckets.first_sight_key) is counted apart: on a GPU it
        meets its kernels' set-up on the request's path (cuDNN's plan for that attention shape, cuBLAS's
        choice of algorithm for those products)."""
        captured = self.graphs.get(shape)
        if captured is None:
            self.counters.eager_steps += 1
            key = first_sight_key(shape)
            if key not in self.eager_shapes:
                self.eager_shapes.add(key)
                self.counters.eager_new_shapes += 1
            return forward()
        captured.graph.replay()
        self.counters.replays += 1
        return captured.output

    def warm(self, shape: StepShape, forward: Callable[[], object]) -> None:
        """Run forward eagerly once off the requests' path, so that a step of this shape later finds its
        kernels set up; counted as a warm-up, not as a step."""
        forward()
        self.eager_shapes.add(first_sight_key(shape))
        self.counters.eager_warmups += 1

    def capture(self, shape: StepShape, forward: Callable[[], torch.Tensor]) -> bool:
        """Warm this shape up eagerly, then capture it; False (logged, counted) when capture fails.

        A warm-up that raises is not caught: that shape could not run eagerly either, so start-up stops
        with the error rather than serve a step size that fails every request that lands on it."""
        if not (self.enabled and shape.graphable) or shape in self.graphs:
            return shape in self.graphs
        forward()
        self.counters.warmups += 1
        graph = torch.cuda.CUDAGraph()
        assert self.pool is not None
        try:
            with capturing(graph, pool=self.pool.current):
                output = forward()
        except Exception as exc:  # noqa: BLE001 - keep serving that shape eagerly, loudly
            log.warning("CUDA graph capture failed for %s; it runs eagerly, later captures take a fresh memory "
                        "pool: %s", shape, exc)
            self.counters.capture_failures += 1
            self.pool.renew()
            return False
        upload(graph)
        self.counters.captures += 1
        self.graphs[shape] = CapturedGraph(graph, output)
        return True


@contextlib.contextmanager
def capturing(graph: torch.cuda.CUDAGraph, pool: Any = None) -> Iterator[None]:
    """torch.cuda.graph(graph, pool), after which a failed capture leaves the process as it found it.

    When a capture fails (an op that cannot be captured invalidates it), torch.cuda.graph raises from
    capture_end before it undoes what capture_begin set up: the thread stays on the capture's side stream,
    the allocator goes on routing to the graph's memory pool (so the next capture into that pool fails,
    "already recording to mempool_id"), and the random generators stay registered with a capture that
    never ended (random draws fail until another capture ends, "Offset increment outside graph capture
    encountered unexpectedly"; bench/RESULTS.md, 2026-12-07 late). When a failure leaves the thread off
    its stream, this restores the stream, ends the routing of allocations to the pool (which did not make
    that pool capturable again on an H100: GraphRunner moves to a fresh pool), and gives each generator a
    fresh state with the same seed and offset; the error is raised as before. A graph without a pool of
    its own gets one here, so that its id is known.
    thread_local: other threads (readers waiting on result events) may use CUDA during a capture.
    """
    stream = torch.cuda.current_stream()
    pool = pool if pool is not None else torch.cuda.graph_pool_handle()
    try:
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            yield
    except BaseException:
        if torch.cuda.current_stream() != stream:  # torch.cuda.graph raised before it undid its set-up
            torch.cuda.set_stream(stream)
            _stop_routing_to(stream.device_index, pool)
            _release_generators()
        raise


def _stop_routing_to(device_index: int, pool: Any) -> None:
    """Stop routing allocations to the pool (where capture_begin got as far as routing; this raises
    otherwise). The hold capture_begin took on the pool is kept: dropping it left a pool that no graph
    held yet with none, and the next capture into it failed an assertion of the allocator (on an H100,
    bench/RESULTS.md, 2026-12-07 late); a runner's pool outlives its graphs anyway, and the few blocks a
    failed capture allocated stay in its pool."""
    try:
        torch._C._cuda_endAllocateToPool(device_index, pool)
    except RuntimeError as exc:
        log.warning("after a failed capture, the allocator's routing to its pool could not be ended: %s", exc)


def _release_generators() -> None:
    for generator in torch.cuda.default_generators:
        fresh = torch.Generator(device=generator.device)
        fresh.set_state(generator.get_state())
        generator.graphsafe_set_state(fresh)


@functools.cache
def _cu_graph_upload() -> Callable[..., int] | None:
    """The driver's cuGraphUpload, or None (logged once) where it or the graph's handle is not at hand."""
    if not hasattr(torch.cuda.CUDAGraph, "raw_cuda_graph_exec"):
        log.warning("this torch gives no graph handle to upload; each graph is replayed once instead")
        return None
    try:
        return ctypes.CDLL("libcuda.so.1").cuGraphUpload
    except (OSError, AttributeError) as exc:
        log.warning("cuGraphUpload is not available (%s); each graph is replayed once instead", exc)
        return None


def upload(graph: torch.cuda.CUDAGraph) -> None:
    """Upload a captured graph to the device on the current stream (the driver's cuGraphUpload).

    A graph's first launch uploads it otherwise: on an H100 that first launch took 0.2-0.5 ms more host
    time than later ones and 0.04-0.38 ms more GPU time (bench/RESULTS.md, 2026-12-07, evening), which
    would fall on the first request of each shape. Replaying would upload too, but runs the step: 8.6 s
    more for a 0.6B model's 396 graphs (2026-12-07; 500 since). Where the driver call is not at hand the
    graph is replayed once, so that no request pays the upload either way.
    """
    cu_graph_upload = _cu_graph_upload()
    if cu_graph_upload is not None:
        stream = torch.cuda.current_stream().cuda_stream
        result = cu_graph_upload(ctypes.c_void_p(graph.raw_cuda_graph_exec()), ctypes.c_void_p(stream))
        if result == 0:
            return
        log.warning("cuGraphUpload returned CUresult %d; replaying the graph once instead", result)
    graph.replay()


def pool_reserved_bytes(pool: GraphPool, device: torch.device) -> int:
    """Bytes of the allocator's segments that belong to the pool's handles on device: what its graphs keep
    reserved.

    Read from the allocator's segments, which carry their pool's id, because the growth of
    memory_reserved() across the captures, read before, was 0 on every GPU although the captures allocate
    (the cause was not traced; the allocator releasing other cached segments would explain it).
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    handles = {tuple(handle) for handle in pool.handles}
    return sum(
        segment["total_size"]
        for segment in torch.cuda.memory_snapshot()
        if tuple(segment["segment_pool_id"]) in handles and segment["device"] == index
    )


def time_with_graph(forward: Callable[[], torch.Tensor], repeats: int = 20) -> float:
    """Milliseconds per replay of forward captured in a throw-away graph (forward must be warmed up)."""
    graph = torch.cuda.CUDAGraph()
    with capturing(graph):
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
