"""Choosing the attention backend per step shape, from times measured on the device and cached.

At start-up every backend that imports is checked against a float32 reference on a small ragged and a
small dense problem; those that fail are dropped. Then a survey of common shapes, ragged and dense, times
each backend that supports them on random inputs, inside a CUDA graph so that only GPU time counts (as
it will when replayed). After the survey the selector is frozen: a step shape seen for the first time
while serving takes the winner of the nearest surveyed shape of its kind, so no request waits for a
measurement (timing six backends costs tens of milliseconds, which would land in the tail latency).

A step that is not replayed from a CUDA graph (eager) prefers a backend that builds no plan per shape
(attention_backends.py) when it is within PLAN_FREE_MARGIN of the fastest: such a step then needs no set-up
at its first sight of a shape, so it runs at its own shape at once instead of padded to its token bucket
while a plan is built off the requests' path (dense_steps.py), which cost an XLM-R-large step about 9 %
(bench/RESULTS.md, 2026-12-07, last). A graph's plans are built at its capture, so graphs take the fastest.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Callable

import torch

from quiver.worker.engine.graphs import capturing
from quiver.worker.engine.layers.attention import AttentionContext, AttentionSpec
from quiver.worker.engine.layers.attention_backends import PaddedSdpa, available_backends

log = logging.getLogger("quiver.engine")

ShapeKey = tuple[int, int, int, int]

PLAN_FREE_MARGIN = 1.10  # an eager step's attention may take this much longer to need no per-shape plan

_VERIFY_TOLERANCE = 2e-2  # relative L2 error; bf16 attention lands near 4e-3
_TIMING_WARMUP = 2
_TIMING_CALLS = 10
_TIMING_REPLAYS = 3


def nearest_winner(key: ShapeKey, winners: dict[ShapeKey, str], usable: Any) -> str | None:
    """Among measured shapes of the same kind (dense: every row the same length, or ragged), the winner
    at the smallest distance in log2 of tokens, longest row and row count; None when none is usable."""
    def distance(other: ShapeKey) -> float:
        return sum(abs(math.log2(max(a, 1)) - math.log2(max(b, 1))) for a, b in zip(key[:3], other[:3]))

    same_kind = [k for k in winners if (k[3] > 0) == (key[3] > 0) and usable(winners[k])]
    if not same_kind:
        return None
    return winners[min(same_kind, key=distance)]


def winner(times: dict[str, float], plan_per_shape: Callable[[str], bool], eager: bool,
           margin: float = PLAN_FREE_MARGIN) -> str:
    """The fastest backend of times; for an eager step, the fastest that builds no per-shape plan instead when
    the fastest builds one and it takes at most margin times as long."""
    fastest = min(times, key=times.__getitem__)
    plan_free = [name for name in times if not plan_per_shape(name)]
    if eager and plan_per_shape(fastest) and plan_free:
        nearest = min(plan_free, key=times.__getitem__)
        if times[nearest] <= margin * times[fastest]:
            return nearest
    return fastest


def _cu_seqlens(lens: list[int], device: torch.device) -> torch.Tensor:
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lens, dtype=torch.int32), 0)
    return cu.to(device)


def context_for_lens(
    lens: list[int], spec: AttentionSpec, device: torch.device, max_seqlen: int | None = None, dense: bool = False
) -> AttentionContext:
    """An AttentionContext for explicit row lengths (for checks and measurements)."""
    cu = _cu_seqlens(lens, device)
    lens_t = torch.tensor(lens, dtype=torch.int64)
    seq_ids = torch.repeat_interleave(torch.arange(len(lens)), lens_t)
    starts = torch.repeat_interleave(cu[:-1].cpu().long(), lens_t)
    positions = torch.arange(int(lens_t.sum())) - starts
    return AttentionContext(
        cu_seqlens=cu,
        seq_ids=seq_ids.to(device=device, dtype=torch.int32),
        positions=positions.to(device=device, dtype=torch.int32),
        num_seqs=len(lens),
        num_tokens=int(lens_t.sum()),
        max_seqlen=max_seqlen or max(lens),
        dense_len=lens[0] if dense else 0,
        spec=spec,
        backend=PaddedSdpa(),
    )


def _random_qkv(ctx: AttentionContext, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """Random q, k, v laid out as the models produce them: views into one fused projection output."""
    spec, device = ctx.spec, ctx.cu_seqlens.device
    widths = [spec.num_heads * spec.head_dim] + [spec.num_kv_heads * spec.head_dim] * 2
    fused = torch.randn(ctx.num_tokens, sum(widths), device=device, dtype=dtype)
    heads = (spec.num_heads, spec.num_kv_heads, spec.num_kv_heads)
    return tuple(
        part.view(ctx.num_tokens, h, spec.head_dim) for part, h in zip(fused.split(widths, dim=-1), heads)
    )


def _graph_time_ms(backend: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: AttentionContext) -> float:
    """GPU time of one call, from replays of a CUDA graph of several calls (no launch overhead)."""
    for _ in range(_TIMING_WARMUP):
        backend(q, k, v, ctx)
    graph = torch.cuda.CUDAGraph()
    with capturing(graph):
        for _ in range(_TIMING_CALLS):
            backend(q, k, v, ctx)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(_TIMING_REPLAYS):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / (_TIMING_REPLAYS * _TIMING_CALLS)


class AttentionSelector:
    def __init__(self, spec: AttentionSpec, device: torch.device, dtype: torch.dtype) -> None:
        self.spec = spec
        self.device = device
        self.dtype = dtype
        self.backends: list[Any] = available_backends(device)
        self.rejected: dict[str, str] = {}
        self.timings_ms: dict[ShapeKey, dict[str, float]] = {}
        self._choice: dict[tuple[ShapeKey, bool], Any] = {}  # (shape, eager) -> backend
        self.plan_free_margin = PLAN_FREE_MARGIN
        self._no_rows = torch.empty(0, dtype=torch.int32, device=device)  # a shape's context without its tensors
        self.frozen = False
        if device.type == "cuda":
            self._verify()

    @property
    def names(self) -> list[str]:
        return [b.name for b in self.backends]

    def _verify(self) -> None:
        ragged = context_for_lens([37, 64, 5, 1, 21, 0, 0, 0], self.spec, self.device, max_seqlen=64)
        dense = context_for_lens([64, 64], self.spec, self.device, dense=True)
        kept = []
        for backend in self.backends:
            problem = None
            for ctx in (ragged, dense):
                if not backend.supports(ctx, self.dtype):
                    continue
                q, k, v = _random_qkv(ctx, self.dtype)
                reference = PaddedSdpa()(q.float(), k.float(), v.float(), ctx)
                try:
                    out = backend(q, k, v, dataclasses.replace(ctx, backend=backend)).float()
                    torch.cuda.synchronize(self.device)
                except Exception as exc:  # noqa: BLE001 - any failure means "not usable here"
                    problem = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                    break
                error = float((out - reference).norm() / reference.norm())
                if not error < _VERIFY_TOLERANCE:
                    problem = f"relative error {error:.3g} against the float32 reference"
                    break
            if problem is None:
                kept.append(backend)
            else:
                self.rejected[backend.name] = problem
        for name, problem in self.rejected.items():
            log.info("attention backend %s not used: %s", name, problem)
        self.backends = kept

    def choose(self, ctx: AttentionContext, eager: bool = False) -> AttentionContext:
        """Return ctx with the verified backend for its shape: the fastest, measured once per shape; for an
        eager step, one without a per-shape plan where it is nearly as fast (module docstring)."""
        return dataclasses.replace(ctx, backend=self._chosen(ctx, eager, may_measure=True))

    def plan_per_shape(self, num_seqs: int, num_tokens: int, max_seqlen: int, dense_len: int) -> bool:
        """Whether an eager step of this shape takes a backend that builds a plan at its first call there
        (to be built off the requests' path then, on the thread that will use it: dense_steps.py). It never
        times anything: a shape not chosen yet takes the nearest surveyed shape's choice once frozen, and
        counts as needing a plan before."""
        shape_only = AttentionContext(
            cu_seqlens=self._no_rows, seq_ids=self._no_rows, positions=self._no_rows, num_seqs=num_seqs,
            num_tokens=num_tokens, max_seqlen=max_seqlen, dense_len=dense_len, spec=self.spec, backend=PaddedSdpa(),
        )
        backend = self._chosen(shape_only, eager=True, may_measure=False)
        return backend is None or backend.plan_per_shape

    def _chosen(self, ctx: AttentionContext, eager: bool, may_measure: bool) -> Any | None:
        """The backend for ctx's shape: chosen before, else borrowed once frozen, else measured (may_measure;
        otherwise None); remembered per (shape, eager)."""
        key = (ctx.num_seqs, ctx.num_tokens, ctx.max_seqlen, ctx.dense_len)
        backend = self._choice.get((key, eager))
        if backend is None:
            backend = self._borrow(key, ctx, eager) if self.frozen else None
            if backend is None and may_measure:
                backend = self._measure(key, ctx, eager)
            if backend is not None:
                self._choice[(key, eager)] = backend
        return backend

    def set_up_dense(self, rows: int, length: int) -> None:
        """Call the backend a dense step of rows x length takes once, on random inputs in the calling thread's
        current stream, and wait for it: what builds that shape's per-thread state (cuDNN's attention plan)
        in the calling thread (dense_steps.py). Only once frozen: a measurement captures CUDA graphs, which
        the stepping thread's work beside it would break."""
        if not self.frozen:
            raise RuntimeError("dense shapes are set up only once the attention survey is done")
        ctx = self.choose(context_for_lens([length] * rows, self.spec, self.device, dense=True), eager=True)
        q, k, v = _random_qkv(ctx, self.dtype)
        ctx.backend(q, k, v, ctx)
        torch.cuda.current_stream(self.device).synchronize()

    def freeze(self) -> None:
        """From now on, shapes not yet seen take the nearest surveyed shape's winner instead of being timed."""
        self.frozen = True

    def winner_of(self, times: dict[str, float], eager: bool) -> str:
        """winner() of these times among this selector's backends, with its margin."""
        return winner(times, lambda name: self._by_name(name).plan_per_shape, eager, self.plan_free_margin)

    def _borrow(self, key: ShapeKey, ctx: AttentionContext, eager: bool) -> Any | None:
        """The winner of the nearest measured shape of the same kind that supports ctx, if any."""
        winners = {measured: self.winner_of(times, eager) for measured, times in self.timings_ms.items() if times}
        name = nearest_winner(key, winners, lambda n: self._by_name(n).supports(ctx, self.dtype))
        return self._by_name(name) if name is not None else None

    def _by_name(self, name: str) -> Any:
        return next(b for b in self.backends if b.name == name)

    def _measure(self, key: ShapeKey, ctx: AttentionContext, eager: bool) -> Any:
        candidates = [b for b in self.backends if b.supports(ctx, self.dtype)] or [PaddedSdpa()]
        if len(candidates) == 1 or self.device.type != "cuda":
            return candidates[0]
        q, k, v = _random_qkv(ctx, self.dtype)
        times: dict[str, float] = {}
        for backend in candidates:
            try:
                times[backend.name] = _graph_time_ms(backend, q, k, v, dataclasses.replace(ctx, backend=backend))
            except Exception as exc:  # noqa: BLE001 - a backend that fails (or cannot be captured) here is skipped
                log.debug("attention backend %s failed at %s: %s", backend.name, key, exc)
        self.timings_ms[key] = times
        if not times:
            return next(b for b in candidates if isinstance(b, PaddedSdpa))
        best = self.winner_of(times, eager)
        log.debug("attention at %s: %s -> %s", key, times, best)
        return next(b for b in candidates if b.name == best)

    def chosen(self) -> dict[str, int]:
        """How many measured shapes each backend won."""
        counts: dict[str, int] = {}
        for backend in self._choice.values():
            counts[backend.name] = counts.get(backend.name, 0) + 1
        return counts
