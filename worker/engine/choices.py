"""Start-up's measured choices of how a model's layers run on a GPU: the fused elementwise set (plain,
torch.compile or Triton), cuBLAS or cuBLASLt, the GELU epilogue and the SwiGLU product. Each is kept only
if its rows agree with the units it replaces and its graph replays measure faster on synthetic probes; the
last two live in the model's op set (ElementwiseOps), where the log reads them from."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from typing import Any, Callable

import numpy as np
import torch

from quiver.worker.engine.batch import Batch
from quiver.worker.engine.buckets import GraphLimits, plan_shape
from quiver.worker.engine.engine import Engine, elapsed_since, synthetic_batch
from quiver.worker.engine.graphs import time_with_graph
from quiver.worker.engine.layers.fused import (
    GELU_KINDS, SWIGLU_PRODUCT_MIN_TOKENS, ElementwiseOps, compiled_ops, triton_kernel_ops,
)

log = logging.getLogger("quiver.engine")


def probe_batch(engine: Engine, num_tokens: int, seq_len: int, seed: int = 0) -> Batch:
    """A synthetic batch for start-up's probes, within the engine's token budget: a 1,024-token probe under
    --max-batch-tokens 1000 overflowed the input buffer, and the fusion sets were dropped as failed."""
    num_tokens = min(num_tokens, engine.info.max_batch_tokens)
    seq_len = max(1, min(seq_len, engine.info.model.max_input_length, num_tokens))
    return synthetic_batch(num_tokens, seq_len, engine.info.model.vocab_size, seed)


def graph_time_ms(engine: Engine, batch: Batch) -> float:
    """Replay time of one step in a throw-away CUDA graph, after an eager warm-up."""
    limits = GraphLimits(engine.info.max_batch_tokens, batch.num_seqs + 1, engine.info.model.max_input_length)
    shape = plan_shape(batch.seq_lens, limits)
    with torch.inference_mode(), torch.cuda.stream(engine.stream):
        tensors = engine.upload(batch, shape)

        def forward() -> torch.Tensor:
            return engine.forward_step(shape, tensors)

        forward()
        return time_with_graph(forward)


def least_cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.min(np.sum(a * b, 1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1) + 1e-30)))


def _fusion_candidate(engine: Engine, name: str) -> ElementwiseOps:
    """Build one fused op set and install it; compile (or JIT) its kernels now, not while serving: one
    row (a size-1 dimension is its own specialisation) and several."""
    engine.model.ops = compiled_ops() if name == "compile" else triton_kernel_ops()
    for tokens, seq_len in ((64, 64), (192, 96), (1024, 512)):
        engine.run_eager(probe_batch(engine, tokens, seq_len))
    return engine.model.ops


def fusion_agreement(fp8_cosine: float | None) -> float:
    """The least cosine a fused set must keep with the plain units: 0.999, or for an FP8 engine twice its
    own divergence from float32 below 1 (two runs whose bf16 roundings differ by one unit meet different
    e4m3 roundings, and drift apart by about as much as each drifts from float32)."""
    return 0.999 if fp8_cosine is None else min(0.999, 1 - 2 * (1 - fp8_cosine))


def choose_fusion(engine: Engine, mode: str, min_agreement: float = 0.999) -> dict[str, Any]:
    """Build the fused elementwise sets (torch.compile, hand-written Triton, or, under "auto", both);
    keep one only if it agrees with the plain units (cosine above min_agreement), and under "auto" the one
    whose graph replays measure fastest, plain included."""
    if mode == "none":
        return {}
    plain: ElementwiseOps = engine.model.ops
    check = probe_batch(engine, 320, 160, seed=1)
    reference = engine.run_eager(check)
    candidates = [plain]
    detail: dict[str, Any] = {}
    for name in ("compile", "triton") if mode == "auto" else (mode,):
        start = time.perf_counter()
        try:
            ops = _fusion_candidate(engine, name)
            cosine = least_cosine(engine.run_eager(check), reference)
        except Exception as exc:  # noqa: BLE001 - any compiler or kernel failure: not a candidate
            log.warning("%s fusion failed, not used: %s", name, exc)
            continue
        finally:
            engine.model.ops = plain
            detail[f"{name}_s"] = elapsed_since(start)
        if cosine <= min_agreement:
            log.warning("%s units disagree with plain ones (cosine %.6f); not used", name, cosine)
            continue
        candidates.append(ops)
    chosen = candidates[-1]
    if mode == "auto" and len(candidates) > 1:
        probes = [probe_batch(engine, 128, 128), probe_batch(engine, 8192, 512)]
        times = {}
        for ops in candidates:
            engine.model.ops = ops
            try:
                times[ops.mode] = [round(graph_time_ms(engine, p), 3) for p in probes]
            except Exception as exc:  # noqa: BLE001 - an op set that cannot be timed is not chosen
                log.warning("fusion probe with %s ops failed: %s", ops.mode, exc)
                times[ops.mode] = [float("inf")]
        detail["fusion_probe_ms"] = times
        chosen = min(candidates, key=lambda ops: sum(times[ops.mode]))
        log.info("fusion probe (graph replay ms at %s tokens): %s", [p.num_tokens for p in probes], times)
    engine.model.ops = chosen
    engine.info.fusion = chosen.mode
    return detail


BLAS_LIBRARIES = ("cublas", "cublaslt")


def _alternating_times_ms(engine: Engine, probes: list[Batch], variants: dict[str, Callable[[], object]],
                          rounds: int = 2) -> dict[str, list[float]]:
    """Graph replay ms of each probe under each variant (installed by calling it), the least over `rounds`
    rounds that alternate between the variants, so that a drift of the GPU's clock meets them all alike."""
    times: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name, install in variants.items():
            install()
            sample = [graph_time_ms(engine, p) for p in probes]
            times[name] = [min(a, b) for a, b in zip(times.get(name, sample), sample)]
    return times


def _rounded(times: dict[str, list[float]]) -> dict[str, list[float]]:
    return {name: [round(t, 3) for t in values] for name, values in times.items()}


def choose_blas(engine: Engine) -> dict[str, Any]:
    """cuBLAS or cuBLASLt for the bf16 products, whichever replays short steps (128 and 512 tokens, where
    the products are bound by reading their weights) faster, in two alternating rounds; before any graph
    is captured. torch's preference is process-wide: one worker serves one engine."""
    probes = [probe_batch(engine, 128, 128), probe_batch(engine, 512, 512)]
    prefer = torch.backends.cuda.preferred_blas_library
    try:
        times = _alternating_times_ms(engine, probes, {library: functools.partial(prefer, library)
                                                       for library in BLAS_LIBRARIES})
    except Exception as exc:  # noqa: BLE001 - a library that cannot be timed is not chosen; cuBLAS stays
        log.warning("blas probe failed, keeping cublas: %s", exc)
        prefer(BLAS_LIBRARIES[0])
        return {}
    chosen = min(BLAS_LIBRARIES, key=lambda library: sum(times[library]))
    prefer(chosen)
    engine.info.blas = chosen
    log.info("blas probe (graph replay ms at 128 / 512 tokens): %s; using %s", _rounded(times), chosen)
    return {"blas_probe_ms": _rounded(times)}


def _keep_if_faster(engine: Engine, key: str, label: str, variant: ElementwiseOps, check: Batch,
                    probes: list[Batch], min_agreement: float) -> dict[str, Any]:
    """Install `variant` of the model's op set if its rows agree with the current set's on `check` (cosine
    above min_agreement) and it replays `probes` faster in two alternating rounds; its figures for the
    start-up detail, named `key`_probe_ms and `key`_cosine ({} if it could not run or disagreed)."""
    current: ElementwiseOps = engine.model.ops

    def use(ops: ElementwiseOps) -> Callable[[], None]:
        return lambda: setattr(engine.model, "ops", ops)

    try:
        reference = engine.run_eager(check)
        use(variant)()
        cosine = least_cosine(engine.run_eager(check), reference)
        if cosine <= min_agreement:
            log.warning("%s disagrees with the separate units (cosine %.6f); not used", label, cosine)
            return {}
        times = _alternating_times_ms(engine, probes, {"separate": use(current), label: use(variant)})
    except Exception as exc:  # noqa: BLE001 - a variant that cannot run or be timed is not used
        log.warning("%s probe failed, not used: %s", label, exc)
        return {}
    finally:
        use(current)()
    kept = sum(times[label]) < sum(times["separate"])
    if kept:
        use(variant)()
    log.info("%s probe (graph replay ms at %s tokens): %s; %s", label, [p.num_tokens for p in probes],
             _rounded(times), "using it" if kept else "keeping separate units")
    return {f"{key}_probe_ms": _rounded(times), f"{key}_cosine": round(cosine, 6)}


def choose_gelu_epilogue(engine: Engine, min_agreement: float = 0.999) -> dict[str, Any]:
    """For a model with GELU layers: their product, bias and GELU in one cuBLASLt call (the epilogue
    computes GELU's tanh form), kept if it agrees with the separate units and replays the probes (128 and
    8,192 tokens) faster."""
    if getattr(engine.model, "hidden_act", "") not in GELU_KINDS:
        return {}
    fused = dataclasses.replace(engine.model.ops, gelu_epilogue=True)
    probes = [probe_batch(engine, 128, 128), probe_batch(engine, 8192, 512)]
    check = probe_batch(engine, 320, 160, seed=1)
    return _keep_if_faster(engine, "gelu_epilogue", "GELU epilogue", fused, check, probes, min_agreement)


def choose_swiglu_product(engine: Engine, min_agreement: float = 0.999) -> dict[str, Any]:
    """For a model with SwiGLU layers on Hopper or newer: the gate/up product and SwiGLU in one Triton
    kernel (layers/swiglu_product.py) for steps of SWIGLU_PRODUCT_MIN_TOKENS or more, kept if it agrees with
    the separate units and replays the probes (2,048 and 8,192 tokens) faster."""
    layers = getattr(engine.model, "layers", [])
    if (not layers or not hasattr(layers[0], "gate_up_weight")
            or engine.info.max_batch_tokens < SWIGLU_PRODUCT_MIN_TOKENS
            or not all(isinstance(getattr(layer, name), torch.Tensor)  # FP8 weights stay torch._scaled_mm's
                       for layer in layers for name in layer.LINEAR_WEIGHTS)):
        return {}
    from quiver.worker.engine.layers import swiglu_product

    reason = swiglu_product.unsupported_reason(engine.model.layers[0].gate_up_weight)
    if reason:
        log.info("SwiGLU product not probed: %s", reason)
        return {}
    fused = dataclasses.replace(engine.model.ops, swiglu_product=swiglu_product.gate_up_silu)
    check = probe_batch(engine, 2 * SWIGLU_PRODUCT_MIN_TOKENS, 512, seed=1)
    probes = [probe_batch(engine, 2048, 512), probe_batch(engine, 8192, 512)]
    return _keep_if_faster(engine, "swiglu_product", "SwiGLU product", fused, check, probes, min_agreement)
