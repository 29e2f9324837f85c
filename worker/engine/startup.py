"""load_engine: build the model, then (on a GPU) make choices.py's measured choices (fusion, BLAS library,
GELU epilogue, SwiGLU product), size the token budget to the memory fraction, measure attention backends at
common shapes, capture every CUDA graph, run every token bucket above the graphs once, and log what the
engine holds. With dtype fp8, the model is first
held to a float32 reference."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from quiver.common.model_info import ModelError, ModelInfo, load_model_info
from quiver.worker.engine.batch import Batch
from quiver.worker.engine.buckets import DEFAULT_GRAPH_MAX_TOKENS, bucket_filling_lens, padded_shape
from quiver.worker.engine.choices import (
    choose_blas, choose_fusion, choose_gelu_epilogue, choose_swiglu_product,
    fusion_agreement, least_cosine, probe_batch,
)
from quiver.worker.engine.engine import Engine, elapsed_since
from quiver.worker.engine.graphs import pool_reserved_bytes
from quiver.worker.engine.layers.attention_select import context_for_lens
from quiver.worker.engine.layers.fused import plain_ops
from quiver.worker.engine.layers.linear import fp8_unavailable_reason
from quiver.worker.engine.loader import build_model
from quiver.worker.engine.memory import describe, peak_bytes_of, tokens_within_budget

log = logging.getLogger("quiver.engine")

DEFAULT_MAX_BATCH_SEQS = 256
# A CPU's step time grows with every token and its throughput barely with the step's size (all-MiniLM-L6-v2
# on two cores: 2.2 s for 4 x 512 tokens, 9.1 s for 16 x 512), and a request that lands during a step waits
# for it: its budget is kept small.
DEFAULT_MAX_BATCH_TOKENS = {"cuda": 16384, "cpu": 2048}
DEFAULT_GPU_MEMORY_FRACTION = 0.9
FUSION_MODES = ("auto", "compile", "triton", "none")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
FP8 = "fp8"  # e4m3 weights of the dense products, bf16 everywhere else
FP8_MIN_COSINE = 0.999  # the least cosine an FP8 engine must keep against float32 on its start-up check


class DtypeUnavailable(ValueError):
    """The dtype asked for cannot run on this device (e.g. fp8 on a CPU); the message says why."""


def resolve_device(device: str) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def resolve_dtype(dtype: str | None, device: torch.device) -> torch.dtype:
    """The activation dtype (bf16 for fp8, whose weights alone are e4m3)."""
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype == FP8:
        reason = fp8_unavailable_reason(device)
        if reason is not None:
            raise DtypeUnavailable(reason)
        return torch.bfloat16
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted([*_DTYPES, FP8])}")
    return _DTYPES[dtype]


def load_engine(
    model_dir: str | Path,
    device: str = "cpu",
    dtype: str | None = None,
    max_batch_tokens: int | None = None,
    max_batch_seqs: int | None = None,
    gpu_memory_fraction: float | None = None,
    cuda_graphs: bool = True,
    fusion: str = "auto",
    graph_max_tokens: int = DEFAULT_GRAPH_MAX_TOKENS,
    fp8_min_cosine: float = FP8_MIN_COSINE,
) -> Engine:
    """Load a checkpoint directory into a ready Engine (bf16 on GPU and float32 on CPU by default).

    dtype "fp8" (Hopper or newer) stores the dense products' weights in e4m3 and refuses, with a
    ModelError, a model whose results fall below fp8_min_cosine against float32 on a start-up check.
    """
    if fusion not in FUSION_MODES:
        raise ValueError(f"fusion must be one of {FUSION_MODES}")
    start = time.perf_counter()
    info = load_model_info(model_dir)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    if dev.type == "cuda" and gpu_memory_fraction is not None:
        torch.cuda.set_per_process_memory_fraction(gpu_memory_fraction, dev)
    tokens = max_batch_tokens or max(DEFAULT_MAX_BATCH_TOKENS.get(dev.type, 8192), info.max_input_length)
    seqs = max_batch_seqs or DEFAULT_MAX_BATCH_SEQS
    fp8_reference = float32_rows(info, dev, tokens, seqs) if dtype == FP8 else None
    with torch.inference_mode():
        model = build_model(info, dev, torch_dtype, plain_ops(), fp8_weights=fp8_reference is not None)
    detail: dict[str, Any] = {"load_s": elapsed_since(start)}
    engine = Engine(model, info, dev, torch_dtype, tokens, seqs, cuda_graphs, graph_max_tokens)
    if fp8_reference is not None:
        engine.info.dtype = FP8
        detail["fp8_min_cosine"] = check_fp8(engine, fp8_reference, fp8_min_cosine)
    if dev.type == "cuda":
        agreement = fusion_agreement(detail.get("fp8_min_cosine"))
        detail.update(choose_fusion(engine, fusion, agreement))
        detail.update(choose_blas(engine))
        detail.update(choose_gelu_epilogue(engine, agreement))
        detail.update(choose_swiglu_product(engine, agreement))
        phase = time.perf_counter()
        size_memory(engine, gpu_memory_fraction or DEFAULT_GPU_MEMORY_FRACTION)
        survey_attention(engine)
        detail["memory_and_attention_s"] = elapsed_since(phase)
        detail.update(capture_graphs(engine))
        detail.update(warm_eager_buckets(engine))
        detail["dense_thread_s"] = engine.prime_dense_steps()
    engine.info.startup_seconds = elapsed_since(start)
    engine.info.startup_detail = detail
    log_startup(engine)
    return engine


def accuracy_probe(vocab_size: int, max_input_length: int) -> Batch:
    """Three sequences of random token ids (512, 128 and 37 long, within the model's limit)."""
    lens = np.minimum([512, 128, 37], max_input_length).astype(np.int32)
    ids = np.random.default_rng(7).integers(3, min(vocab_size, 30000), size=int(lens.sum()), dtype=np.int32)
    return Batch(input_ids=ids, seq_lens=lens)


def float32_rows(info: ModelInfo, device: torch.device, max_batch_tokens: int, max_batch_seqs: int) -> np.ndarray:
    """The accuracy probe's rows from the checkpoint in float32, plain units, no graphs: the reference an
    FP8 engine is held to. The float32 model is dropped before the FP8 one is built."""
    with torch.inference_mode():
        model = build_model(info, device, torch.float32, plain_ops())
    reference = Engine(model, info, device, torch.float32, max_batch_tokens, max_batch_seqs, cuda_graphs=False)
    rows = reference.run_eager(accuracy_probe(info.vocab_size, info.max_input_length))
    del reference, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def check_fp8(engine: Engine, reference: np.ndarray, min_cosine: float) -> float:
    """The FP8 engine's least cosine with the float32 reference; a ModelError below min_cosine."""
    model = engine.info.model
    cosine = least_cosine(engine.run_eager(accuracy_probe(model.vocab_size, model.max_input_length)), reference)
    if not cosine >= min_cosine:
        raise ModelError(
            f"{model.name} cannot be served in FP8: its results keep a cosine of only {cosine:.5f} with the "
            f"float32 model's on the start-up check (at least {min_cosine} is required); serve it with "
            f"--dtype bfloat16")
    log.info("fp8: e4m3 weights, per-token activation scales; cosine %.6f against float32 at start-up", cosine)
    return round(cosine, 6)


def size_memory(engine: Engine, fraction: float) -> None:
    """Fit the token budget and graph buckets into fraction of the GPU; measure the activation peak."""
    figures, dev = engine.memory, engine.device
    figures.total_bytes = torch.cuda.get_device_properties(dev).total_memory
    figures.budget_bytes = int(figures.total_bytes * fraction)
    probe = probe_batch(engine, 4096, 512)
    engine.run_eager(probe)  # first run measures attention backends; keep their buffers out of the peak
    peak = peak_bytes_of(lambda: engine.run_eager(probe), dev)
    figures.bytes_per_token = math.ceil(peak / probe.num_tokens)
    tokens = tokens_within_budget(figures, engine.info.max_batch_tokens)
    if tokens < engine.info.max_batch_tokens:
        log.warning(
            "gpu memory fraction %.2f: token budget lowered from %d to %d",
            fraction, engine.info.max_batch_tokens, tokens,
        )
        engine.set_graph_limits(tokens, engine.info.max_batch_seqs)
    largest = probe_batch(engine, engine.info.max_batch_tokens, 512)
    engine.run_eager(largest)
    figures.activation_peak_bytes = peak_bytes_of(lambda: engine.run_eager(largest), dev)
    engine.info.activation_peak_bytes = figures.activation_peak_bytes
    engine.info.gpu_total_bytes = figures.total_bytes
    engine.info.gpu_budget_bytes = figures.budget_bytes


RAGGED_SURVEY = ((4, 128), (16, 256), (16, 1024), (8, 4096), (64, 512))  # (rows, longest row)


def survey_attention(engine: Engine) -> None:
    """Measure the attention backends at common shapes, dense (equal rows) and ragged, log them, and
    freeze the selector: shapes met later while serving borrow the nearest surveyed shape's winner."""
    spec, dev = engine.model.attention_spec, engine.device
    budget = engine.info.max_batch_tokens
    limit = min(budget, engine.info.model.max_input_length)
    for rows, length in ((1, 128), (1, 512), (1, 4096), (16, 512), (8, 1024), (32, 512), (4, 4096)):
        if rows * length <= budget and length <= limit:
            engine.selector.choose(context_for_lens([length] * rows, spec, dev, dense=True))
    for rows, longest in RAGGED_SURVEY:
        lens = [max(1, longest * (rows - i) // rows) for i in range(rows)]  # longest down to longest/rows
        if sum(lens) <= budget and longest <= limit:
            engine.selector.choose(context_for_lens(lens, spec, dev))
    for key, times in engine.selector.timings_ms.items():
        if not times:
            continue
        eager = engine.selector.winner_of(times, eager=True)
        note = "" if eager == engine.selector.winner_of(times, eager=False) else f"eager steps take {eager}; "
        log.info("attention %s: %s%s", key, note, {k: round(v, 4) for k, v in sorted(times.items(), key=lambda kv: kv[1])})
    engine.selector.freeze()


def capture_graphs(engine: Engine) -> dict[str, Any]:
    """Capture every graph shape the engine can meet (buckets.graph_shapes), so that no request ever
    waits for a warm-up or a capture; the time it took goes into the start-up detail."""
    shapes = [(shape, token_rows) for token_rows in (False, True) for shape in engine.graph_shapes(token_rows)]
    # Largest first: a smaller graph's memory then comes out of segments the larger ones freed, instead of
    # the small graphs' live outputs splitting the segments that each larger capture would need.
    shapes.sort(key=lambda item: item[0].num_tokens, reverse=True)
    start = time.perf_counter()
    failed = sum(not engine.capture_graph(shape, token_rows) for shape, token_rows in shapes)
    torch.cuda.synchronize(engine.device)
    if shapes and engine.runner.pool is not None:
        engine.graph_pool_bytes = pool_reserved_bytes(engine.runner.pool, engine.device)
    if failed:
        log.warning("%d of %d CUDA graph shapes could not be captured; they run eagerly", failed, len(shapes))
    log.info("captured %d CUDA graphs in %.1f s (pool %s)", len(shapes) - failed, time.perf_counter() - start,
             describe(engine.graph_pool_bytes))
    return {"graphs": len(shapes) - failed, "graphs_s": elapsed_since(start)}


def warm_eager_buckets(engine: Engine) -> dict[str, Any]:
    """Run one ragged step at every token bucket above the graphs (sequence rows, and BGE-M3's token rows),
    so that no eager step on a request's path is the first at its token count (buckets.first_sight_key):
    on an H100 such a first step of XLM-R large took 0-4 ms more than the same step again (bench/RESULTS.md,
    2026-12-07, last); XLM-R large's 32 buckets ran in 0.5 s."""
    start = time.perf_counter()
    warmed = 0
    for token_rows in (False, True) if engine.info.model.m3_heads else (False,):
        limits = engine.token_graph_limits if token_rows else engine.graph_limits
        for bucket in engine.eager_buckets(token_rows):
            lens = bucket_filling_lens(bucket, engine.info.model.max_input_length, engine.info.max_batch_seqs)
            if lens is not None:  # else no batch the engine takes reaches this bucket
                engine.warm_eager(padded_shape(np.array(lens), limits), lens, token_rows)
                warmed += 1
    torch.cuda.synchronize(engine.device)
    if warmed:
        log.info("ran %d token buckets above the graphs once in %.1f s", warmed, time.perf_counter() - start)
    return {"eager_buckets": warmed, "eager_buckets_s": elapsed_since(start)}


def log_startup(engine: Engine) -> None:
    info, figures, ops = engine.info, engine.memory, engine.model.ops
    log.info(
        "engine ready: %s (%s) on %s in %s; output dim %d; up to %d tokens / %d sequences per step; "
        "CUDA graphs %s (up to %d tokens); fusion %s; products %s%s%s; attention backends %s",
        info.model.name, info.model.kind, info.device, info.dtype, info.output_dim,
        info.max_batch_tokens, info.max_batch_seqs, "on" if info.cuda_graphs else "off",
        info.graph_max_tokens, info.fusion, info.blas, " with the GELU epilogue" if ops.gelu_epilogue else "",
        " with the SwiGLU product" if ops.swiglu_product is not None else "",
        info.attention_backends,
    )
    if engine.on_gpu:
        log.info(
            "gpu memory: weights %s, activation peak at %d tokens %s (%d bytes/token), budget %s of %s; "
            "graph pool %s",
            describe(figures.weights_bytes), info.max_batch_tokens, describe(figures.activation_peak_bytes),
            figures.bytes_per_token, describe(figures.budget_bytes), describe(figures.total_bytes),
            describe(engine.graph_pool_bytes),
        )
    log.info("start-up took %.1f s: %s", info.startup_seconds, info.startup_detail)
