"""The engine: one model on one device, stepping ragged batches into LazyTensors.

step() validates the batch, pads it to its graph shape (buckets.py), moves it to the device with one
copy from a pinned staging buffer, runs the model (by replaying that shape's CUDA graph, captured at
start-up, or eagerly when it has none), and starts an asynchronous copy of the result rows into a
pinned output slot. An eager step never meets an attention plan's first build on a request's path (see
_met_shape): every token bucket above the graphs runs once at start-up (warm_eager_buckets), and rows of one
length whose attention builds a plan per shape (cuDNN's), at a shape not set up, run padded to their bucket
while the dense-step thread sets their shape up (dense_steps.py), on which such steps then run. On the
CPU it computes the result at once. A step of token rows (one row per token, BGE-M3's sparse and ColBERT
outputs) is computed synchronously instead, replaying a graph of its own shape up to TOKEN_GRAPH_MAX_TOKENS
on a BGE-M3 checkpoint.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np
import torch

from quiver.common.model_info import KIND_EMBEDDING, ModelInfo
from quiver.common.ragged import check_shape
from quiver.worker.engine.batch import Batch
from quiver.worker.engine.buckets import (
    DEFAULT_GRAPH_MAX_TOKENS, NO_GRAPHS, GraphLimits, StepShape, dense_priming_lens, example_lens, graph_shapes,
    padded_shape, plan_shape, token_buckets,
)
from quiver.worker.engine.dense_steps import DenseStepThread
from quiver.worker.engine.graphs import GraphRunner
from quiver.worker.engine.inputs import StepTensors, pack_batch, packed_size, unpack
from quiver.worker.engine.layers.attention import AttentionContext
from quiver.worker.engine.layers.attention_backends import PaddedSdpa
from quiver.worker.engine.layers.attention_select import AttentionSelector
from quiver.worker.engine.lazy import HostSlots, LazyTensor
from quiver.worker.engine.memory import MemoryFigures
from quiver.worker.engine.models.base import RaggedModel
from quiver.worker.engine.pooling import normalize_rows

NUM_HOST_SLOTS = 2
# Token-row steps (BGE-M3's sparse and ColBERT outputs) have graphs up to this many tokens: a query's
# sparse vector is a batch-1 step whose eager launch costs the host far more than its kernels. Each such
# graph keeps its own output, a float32 row per token: 46 graphs and 53 MiB at BGE-M3's width.
TOKEN_GRAPH_MAX_TOKENS = 512
_STEPPING = threading.local()  # per thread: the stream an engine's step() last made current there


@dataclass
class EngineInfo:
    model: ModelInfo
    device: str
    dtype: str
    output_dim: int
    max_batch_tokens: int
    max_batch_seqs: int
    cuda_graphs: bool = False
    graph_max_tokens: int = 0  # steps padded above this run eagerly
    fusion: str = "none"
    attention_backends: list[str] = field(default_factory=list)
    weights_bytes: int = 0
    activation_peak_bytes: int = 0
    gpu_total_bytes: int = 0
    gpu_budget_bytes: int = 0
    startup_seconds: float = 0.0
    startup_detail: dict[str, Any] = field(default_factory=dict)
    blas: str = "cublas"  # the library of the bf16 products (start-up chooses on a GPU)


class Engine:
    """One model on one device. step() is called from one thread; LazyTensors may be waited on and
    released from any thread."""

    def __init__(
        self,
        model: RaggedModel,
        model_info: ModelInfo,
        device: torch.device,
        dtype: torch.dtype,
        max_batch_tokens: int,
        max_batch_seqs: int,
        cuda_graphs: bool,
        graph_max_tokens: int = DEFAULT_GRAPH_MAX_TOKENS,
    ) -> None:
        self.model = model
        self.device = device
        self.dtype = dtype
        self.on_gpu = device.type == "cuda"
        self.memory = MemoryFigures(weights_bytes=model.parameters_bytes())
        self.info = EngineInfo(
            model=model_info,
            device=str(device),
            dtype=str(dtype).removeprefix("torch."),
            output_dim=model.output_dim,
            max_batch_tokens=max_batch_tokens,
            max_batch_seqs=max_batch_seqs,
            cuda_graphs=cuda_graphs and self.on_gpu,
            fusion=model.ops.mode,
            weights_bytes=self.memory.weights_bytes,
        )
        self.selector = AttentionSelector(model.attention_spec, device, dtype)
        self.info.attention_backends = self.selector.names
        self.runner = GraphRunner(device, cuda_graphs)
        self.token_runner = GraphRunner(device, cuda_graphs and model_info.m3_heads, pool=self.runner.pool)
        self.graph_pool_bytes = 0  # both runners' one pool, measured once their graphs are captured
        self.token_graph_limits = NO_GRAPHS
        self.steps = 0
        self._graph_token_limit = graph_max_tokens
        self.graph_limits = NO_GRAPHS
        if self.on_gpu:
            self.set_graph_limits(max_batch_tokens, max_batch_seqs)
            self.stream = torch.cuda.Stream(device)
            self.dense_steps = DenseStepThread(device, self.stream, self._set_up_dense)
            self._set_up_stream = torch.cuda.Stream(device)  # dense set-ups' work beside the steps'
            capacity = packed_size(max_batch_seqs + 1, max_batch_tokens)
            self._staging = [torch.empty(capacity, dtype=torch.int32, pin_memory=True) for _ in range(2)]
            self._staging_arrays = [staging.numpy() for staging in self._staging]
            self._staging_events = [torch.cuda.Event() for _ in range(2)]
            self._next_staging = 0
            self._device_inputs = torch.zeros(capacity, dtype=torch.int32, device=device)
            # (staging buffer, a graph shape's packed size) -> (device slice, staging slice): a step's input copy
            self._input_copies: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
            self.slots = HostSlots(NUM_HOST_SLOTS, max_batch_seqs, model.output_dim)
            self._slot_events = [torch.cuda.Event() for _ in range(NUM_HOST_SLOTS)]
            self._host_views: dict[tuple[int, int], tuple[torch.Tensor, np.ndarray]] = {}
            self._views: dict[StepShape, StepTensors] = {}  # device views per graph shape

    def set_graph_limits(self, max_tokens: int, max_seqs: int) -> None:
        """Bound batches and graph buckets (start-up sizing may lower them to fit memory)."""
        self.info.max_batch_tokens = max_tokens
        self.info.max_batch_seqs = max_seqs
        if self.info.cuda_graphs:
            self.info.graph_max_tokens = min(self._graph_token_limit, max_tokens)
            self.graph_limits = GraphLimits(self.info.graph_max_tokens, max_seqs + 1, self.info.model.max_input_length,
                                            eager_pad_tokens=max_tokens)
        else:
            self.graph_limits = GraphLimits(0, 0, 0, eager_pad_tokens=max_tokens)
        token_graph_tokens = min(TOKEN_GRAPH_MAX_TOKENS, self.graph_limits.max_tokens) if self.token_runner.enabled else 0
        self.token_graph_limits = replace(self.graph_limits, max_tokens=token_graph_tokens)

    def capture_graph(self, shape: StepShape, token_rows: bool = False) -> bool:
        """Capture one graph shape of the sequence rows' forward, or the token rows' (start-up only: it runs
        the model twice); False if it could not be."""
        lens = np.array(example_lens(shape, self.info.model.max_input_length), dtype=np.int32)
        ids = np.random.default_rng(0).integers(3, self.info.model.vocab_size, size=int(lens.sum()), dtype=np.int32)
        batch = Batch(input_ids=ids, seq_lens=lens)
        runner, forward = (self.token_runner, self.forward_tokens) if token_rows else (self.runner, self.forward_step)
        with torch.inference_mode(), torch.cuda.stream(self.stream):
            tensors = self.upload(batch, shape)
            return runner.capture(shape, lambda: forward(shape, tensors))

    def graph_shapes(self, token_rows: bool = False) -> list[StepShape]:
        return graph_shapes(self.token_graph_limits if token_rows else self.graph_limits)

    # ---- stepping -------------------------------------------------------------------------------

    def step(self, batch: Batch) -> LazyTensor:
        """Launch one batch; the LazyTensor's row i is sequence i's result (token i's, for token rows)."""
        self._check_shapes(batch)
        self.steps += 1
        if batch.token_rows:
            return LazyTensor(self.run_tokens(batch))
        if not self.on_gpu:
            return LazyTensor(self.run_eager(batch))
        shape = self._met_shape(plan_shape(batch.seq_lens, self.graph_limits), batch, token_rows=False)
        slot = self.slots.acquire()
        try:
            self._use_stream()
            tensors = self.upload(batch, shape)
            out = self._run(self.runner, shape, lambda: self._forward_eagerly(shape, tensors))
            host, rows = self._host_rows(slot, batch.num_seqs)
            host.copy_(out[: batch.num_seqs], non_blocking=True)
            event = self._slot_events[slot]  # reused: the slot's last reader has released it
            event.record(self.stream)
        except BaseException:
            self.slots.release(slot)
            raise
        return LazyTensor(rows, event, self.slots, slot)

    def _met_shape(self, shape: StepShape, batch: Batch, token_rows: bool) -> StepShape:
        """shape, or, for a step whose attention needs a plan the dense-step thread has not built yet, the
        batch as ragged rows padded to its token bucket (warmed at start-up), the plan's set-up queued there.

        A dense shape's first run with cuDNN's attention builds its plan: on an H100, 45-105 ms more for an
        XLM-R-large step of 17-30 rows of 532 tokens, 48-72 ms of it the plan, which PyTorch keeps per thread
        (bench/RESULTS.md, 2026-12-07, last). Padded, the step runs a ragged kernel instead: about 9 % slower
        there with FlashAttention-2, until its shape is set up (dense_steps.py). Where a backend without plans
        is nearly as fast, eager steps take it (attention_select.py) and run at their own shape at once."""
        if not self._needs_plan(shape) or self.dense_steps.ready(shape):
            return shape
        self.dense_steps.set_up_later(shape, token_rows)
        return padded_shape(batch.seq_lens, self.token_graph_limits if token_rows else self.graph_limits)

    def _needs_plan(self, shape: StepShape) -> bool:
        """Whether shape is an eager step of rows of one length whose attention builds a plan per shape."""
        return bool(shape.dense_len) and not shape.graphable and self.selector.plan_per_shape(
            shape.num_seqs, shape.num_tokens, shape.max_seqlen, shape.dense_len)

    def _run(self, runner: GraphRunner, shape: StepShape, forward: Callable[[], torch.Tensor]) -> torch.Tensor:
        """runner.run(shape, forward); a step that needs a plan on the dense-step thread, where its plan is."""
        if self._needs_plan(shape):
            return self.dense_steps.run(lambda: runner.run(shape, forward))
        return runner.run(shape, forward)

    def _set_up_dense(self, shape: StepShape, token_rows: bool) -> None:
        """On the dense-step thread: build what a dense step of shape meets at first sight (its attention's
        plan), on a stream of its own beside the steps; counted as an eager warm-up."""
        runner = self.token_runner if token_rows else self.runner
        with torch.cuda.stream(self._set_up_stream):
            runner.warm(shape, lambda: self.selector.set_up_dense(shape.num_seqs, shape.dense_len))

    def prime_dense_steps(self) -> float:
        """Run the smallest dense steps above the graphs on the dense-step thread (start-up only), so that its
        first work happens before serving, not on a request: that thread's first CUDA calls (PyTorch's
        per-thread cuBLAS and cuDNN handles), and the Triton kernels' versions for a token count not divisible
        by 16, which no bucketed step has but dense steps do (Triton compiles a kernel apart for each; its
        row norms' tile depends on the token count too, hence steps as large as the dense ones above the
        graphs: buckets.dense_priming_lens). Returns the seconds taken."""
        start = time.perf_counter()
        info = self.info
        for lens in dense_priming_lens(self.graph_limits, info.model.max_input_length, info.max_batch_tokens,
                                       info.max_batch_seqs):
            batch = synthetic_batch(sum(lens), lens[0], info.model.vocab_size)
            self.dense_steps.run(functools.partial(self.run_eager, batch))
        return elapsed_since(start)

    def warm_eager(self, shape: StepShape, lens: list[int], token_rows: bool = False) -> None:
        """Run one eager step of shape (a batch of these row lengths) off the requests' path."""
        seq_lens = np.array(lens, dtype=np.int32)
        ids = np.random.default_rng(0).integers(3, self.info.model.vocab_size, size=int(seq_lens.sum()), dtype=np.int32)
        runner, forward = (self.token_runner, self.forward_tokens) if token_rows else (self.runner, self.forward_step)
        with torch.inference_mode(), torch.cuda.stream(self.stream):
            tensors = self.upload(Batch(input_ids=ids, seq_lens=seq_lens), shape)
            runner.warm(shape, lambda: forward(shape, tensors))

    def eager_buckets(self, token_rows: bool = False) -> list[int]:
        """The token buckets above a runner's graphs: the token counts its eager ragged steps come in."""
        limits = self.token_graph_limits if token_rows else self.graph_limits
        return [size for size in token_buckets(self.info.max_batch_tokens) if size > limits.max_tokens]

    def _use_stream(self) -> None:
        """Make the engine's stream the calling thread's current one, unless an engine's step already did
        and no other engine's step has since (the scheduler's thread steps one engine): entering
        torch.cuda.stream() on every step took ~50 µs of a batch-1 step's launch on a GPU host
        (`hop_trace --detail`, bench/RESULTS.md). The engine's own `with torch.cuda.stream(...)` blocks
        restore the stream they found, so the record stays true. What step() does with the stream current
        (copies, a graph's replay) records nothing for autograd; an eager forward enters inference mode."""
        if getattr(_STEPPING, "stream", None) is not self.stream:
            torch.cuda.set_stream(self.stream)
            _STEPPING.stream = self.stream

    def _forward_eagerly(self, shape: StepShape, tensors: StepTensors) -> torch.Tensor:
        with torch.inference_mode():
            return self.forward_step(shape, tensors)

    def _host_rows(self, slot: int, num_seqs: int) -> tuple[torch.Tensor, np.ndarray]:
        """The first num_seqs rows of a result slot, as a tensor (the copy's target) and an array (the
        LazyTensor's), made once per (slot, rows)."""
        key = (slot, num_seqs)
        views = self._host_views.get(key)
        if views is None:
            host = self.slots.buffers[slot][:num_seqs]
            views = self._host_views[key] = (host, host.numpy())
        return views

    def upload(self, batch: Batch, shape: StepShape) -> StepTensors:
        """Pack the batch for shape and copy it to the device (GPU only); the views the model reads.

        upload() and forward_step() are the two halves of a step, public for start-up probes and
        profiling; call them inside `torch.inference_mode()` and `torch.cuda.stream(engine.stream)`.
        """
        index = self._next_staging
        self._next_staging ^= 1
        self._staging_events[index].synchronize()  # the last copy out of this staging buffer is done
        size = pack_batch(batch, shape, self._staging_arrays[index], self.model.uses_token_types)
        copy = self._input_copies.get((index, size))
        if copy is None:
            copy = (self._device_inputs[:size], self._staging[index][:size])
            if shape.graphable:  # a bounded set of sizes; an eager step's exact size may never come again
                self._input_copies[(index, size)] = copy
        copy[0].copy_(copy[1], non_blocking=True)
        self._staging_events[index].record(self.stream)
        if not shape.graphable:
            return unpack(self._device_inputs, shape)
        views = self._views.get(shape)
        if views is None:
            views = self._views[shape] = unpack(self._device_inputs, shape)
        return views

    def forward_step(self, shape: StepShape, step: StepTensors) -> torch.Tensor:
        """The model on one uploaded step, then row normalisation: float32 [shape.num_seqs, output_dim]."""
        out = self.model.forward(step, self._attention(shape, step))
        if self.info.model.kind == KIND_EMBEDDING:
            out = normalize_rows(out, step.normalize)
        return out

    def forward_tokens(self, shape: StepShape, step: StepTensors) -> torch.Tensor:
        """The model's token rows on one uploaded step: float32 [shape.num_tokens, token_dim]."""
        return self.model.forward_tokens(step, self._attention(shape, step))

    def _attention(self, shape: StepShape, step: StepTensors) -> AttentionContext:
        return self.selector.choose(
            AttentionContext(
                cu_seqlens=step.cu_seqlens,
                seq_ids=step.seq_ids,
                positions=step.positions,
                num_seqs=shape.num_seqs,
                num_tokens=shape.num_tokens,
                max_seqlen=shape.max_seqlen,
                dense_len=shape.dense_len,
                spec=self.model.attention_spec,
                backend=PaddedSdpa(),
            ),
            eager=not shape.graphable,
        )

    def run_eager(self, batch: Batch, bucketed: bool = False) -> np.ndarray:
        """One step without graphs or result slots (CPU steps, start-up probes, tests); returns the rows.

        bucketed=True pads the batch to its graph shape, as a replayed graph would see it.
        """
        limits = GraphLimits(self.info.max_batch_tokens, self.info.max_batch_seqs + 1, self.info.model.max_input_length)
        shape = plan_shape(batch.seq_lens, limits if bucketed else NO_GRAPHS)
        if not self.on_gpu:
            with torch.inference_mode():
                return self.forward_step(shape, self._host_step(batch, shape))[: batch.num_seqs].cpu().numpy()
        with torch.inference_mode(), torch.cuda.stream(self.stream):
            out = self.forward_step(shape, self.upload(batch, shape))[: batch.num_seqs].cpu()
        return out.numpy()

    def run_tokens(self, batch: Batch) -> np.ndarray:
        """float32 [num_tokens, token_dim]: the model's row for every token, computed synchronously (a step's
        rows vary with its tokens, so the fixed result slots do not fit them). On a GPU a step replays its
        token-row graph up to token_graph_limits, and runs eagerly, padded to its bucket, above them."""
        shape = plan_shape(batch.seq_lens, self.token_graph_limits)
        with torch.inference_mode():
            if self.on_gpu:
                shape = self._met_shape(shape, batch, token_rows=True)
                with torch.cuda.stream(self.stream):
                    uploaded = self.upload(batch, shape)
                    rows = self._run(self.token_runner, shape, lambda: self.forward_tokens(shape, uploaded))
                    return self._token_columns(rows[: batch.num_tokens], batch).cpu().numpy()
            rows = self.forward_tokens(shape, self._host_step(batch, shape))
            return self._token_columns(rows[: batch.num_tokens], batch).numpy()

    def _host_step(self, batch: Batch, shape: StepShape) -> StepTensors:
        """A CPU step's inputs: the batch packed for shape, unpacked into views of that one array."""
        packed = np.empty(packed_size(shape.num_seqs, shape.num_tokens), dtype=np.int32)
        pack_batch(batch, shape, packed, self.model.uses_token_types)
        return unpack(torch.from_numpy(packed), shape)

    @staticmethod
    def _token_columns(rows: torch.Tensor, batch: Batch) -> torch.Tensor:
        """The columns the batch asks for, cut on the device so that only they are copied to the host."""
        return rows[:, -1:] if batch.lexical_only else rows

    def _check_shapes(self, batch: Batch) -> None:
        """Shapes and sizes only: the ids' contents were validated where they entered the worker (the
        scheduler's intake), so nothing here reads every token."""
        check_shape(batch)
        if batch.num_seqs < 1 or int(batch.seq_lens.min()) < 1:
            raise ValueError("a batch needs at least one sequence and every sequence at least one token")
        if batch.num_tokens > self.info.max_batch_tokens or batch.num_seqs > self.info.max_batch_seqs:
            raise ValueError(
                f"batch of {batch.num_seqs} sequences / {batch.num_tokens} tokens exceeds the engine's limits "
                f"({self.info.max_batch_seqs} / {self.info.max_batch_tokens})"
            )
        if int(batch.seq_lens.max()) > self.info.model.max_input_length:
            raise ValueError(f"a sequence of {int(batch.seq_lens.max())} tokens exceeds {self.info.model.max_input_length}")
        if batch.normalize is not None and np.asarray(batch.normalize).shape != (batch.num_seqs,):
            raise ValueError("normalize must have one flag per sequence")

    # ---- reporting ------------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        runners = (self.runner, self.token_runner)
        stats: dict[str, Any] = {
            "steps": self.steps,
            "warmups": sum(r.counters.warmups for r in runners),
            "captures": sum(r.counters.captures for r in runners),
            "replays": sum(r.counters.replays for r in runners),
            "eager_steps": sum(r.counters.eager_steps for r in runners),
            "eager_new_shapes": sum(r.counters.eager_new_shapes for r in runners),
            "eager_warmups": sum(r.counters.eager_warmups for r in runners),
            "capture_failures": sum(r.counters.capture_failures for r in runners),
            "graphs": sum(len(r.graphs) for r in runners),
            "graph_pool_bytes": self.graph_pool_bytes,
            "weights_bytes": self.memory.weights_bytes,
            "activation_peak_bytes": self.memory.activation_peak_bytes,
            "attention_choices": self.selector.chosen(),
        }
        if self.on_gpu:
            stats["free_result_slots"] = self.slots.free
            stats["gpu_allocated_bytes"] = torch.cuda.memory_allocated(self.device)
            stats["gpu_reserved_bytes"] = torch.cuda.memory_reserved(self.device)
        return stats


def synthetic_batch(num_tokens: int, seq_len: int, vocab_size: int, seed: int = 0) -> Batch:
    """Random ids in sequences of seq_len (the last one shorter) adding up to num_tokens."""
    lens = [seq_len] * (num_tokens // seq_len) + ([num_tokens % seq_len] if num_tokens % seq_len else [])
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab_size, size=num_tokens, dtype=np.int32)
    return Batch(input_ids=ids, seq_lens=np.asarray(lens, dtype=np.int32))


def elapsed_since(start: float) -> float:
    return round(time.perf_counter() - start, 3)
