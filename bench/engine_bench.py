"""Engine alone against Hugging Face transformers, in the same run, on random weights of real shapes.

Models: Qwen3-0.6B bidirectional + mean pooling (standing for pplx-embed-0.6B) and XLM-R large with CLS
pooling (standing for BGE-M3). Checkpoints are written at run time (nothing is downloaded). Measures
batch-1 latency (p50/p90/p99/max, host clock around step() + wait()) at 128, 512 and 4096 tokens and
throughput (embeddings/s, two steps in flight) at 100x512, 100x1024 and 25x4096; writes a JSON file and
prints a Markdown table. --dtypes bfloat16,fp8 runs the engine once per dtype; --gate checks each against
float32 transformers on 12 real inputs (the HTTP suite's correctness gate, in-process).

    python -m quiver.bench.engine_bench --out results.json [--ckpt-dir DIR] [--device cuda] [--dtypes bfloat16,fp8]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from quiver.bench.engine.checkpoints import BENCH_MODELS, ensure_bench_checkpoint, load_reference
from quiver.worker.engine import Batch, Engine, load_engine

LATENCY_LENGTHS = (128, 512, 4096)
THROUGHPUT_WORKLOADS = ((100, 512), (100, 1024), (25, 4096))


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    values = np.asarray(samples_ms)
    return {
        "p50": round(float(np.percentile(values, 50)), 3),
        "p90": round(float(np.percentile(values, 90)), 3),
        "p99": round(float(np.percentile(values, 99)), 3),
        "max": round(float(values.max()), 3),
        "n": len(samples_ms),
    }


def random_ids(rng: np.random.Generator, length: int, vocab: int) -> np.ndarray:
    return rng.integers(3, min(vocab, 30000), size=length, dtype=np.int32)


# ---- transformers ---------------------------------------------------------------------------------


def hf_embed(model: Any, ids: torch.Tensor, pooling: str) -> np.ndarray:
    hidden = model(input_ids=ids).last_hidden_state
    pooled = hidden[:, 0] if pooling == "cls" else hidden.mean(1)
    return torch.nn.functional.normalize(pooled.float(), dim=-1).cpu().numpy()


def hf_latency(model: Any, pooling: str, length: int, iters: int, vocab: int, device: str) -> list[float]:
    rng = np.random.default_rng(length)
    ids = torch.tensor(random_ids(rng, length, vocab)[None], dtype=torch.long, device=device)
    samples = []
    with torch.inference_mode():
        for i in range(iters + 3):
            start = time.perf_counter()
            hf_embed(model, ids, pooling)
            if i >= 3:
                samples.append((time.perf_counter() - start) * 1e3)
    return samples


def hf_throughput(model: Any, pooling: str, count: int, length: int, batch_tokens: int, vocab: int, device: str) -> float:
    rng = np.random.default_rng(count * length)
    per_batch = max(1, batch_tokens // length)
    batches = []
    for first in range(0, count, per_batch):
        rows = min(per_batch, count - first)
        ids = np.stack([random_ids(rng, length, vocab) for _ in range(rows)])
        batches.append(torch.tensor(ids, dtype=torch.long, device=device))
    with torch.inference_mode():
        for ids in batches[:1]:
            hf_embed(model, ids, pooling)
        start = time.perf_counter()
        for ids in batches:
            hf_embed(model, ids, pooling)
        elapsed = time.perf_counter() - start
    return count / elapsed


# ---- engine ---------------------------------------------------------------------------------------


def one_batch(sequences: list[np.ndarray]) -> Batch:
    return Batch(
        input_ids=np.concatenate(sequences),
        seq_lens=np.array([len(s) for s in sequences], dtype=np.int32),
        normalize=np.ones(len(sequences), dtype=bool),
    )


def engine_latency(engine: Engine, length: int, iters: int, vocab: int) -> tuple[list[float], list[float]]:
    """Per-request milliseconds around step() + wait(), and until step() returned (host launch cost)."""
    rng = np.random.default_rng(length)
    batch = one_batch([random_ids(rng, length, vocab)])
    samples, launches = [], []
    for i in range(iters + 5):  # warm-up, capture, then replays
        start = time.perf_counter()
        lazy = engine.step(batch)
        launched = time.perf_counter()
        lazy.wait()
        lazy.release()
        if i >= 5:
            samples.append((time.perf_counter() - start) * 1e3)
            launches.append((launched - start) * 1e3)
    return samples, launches


def launch_two_deep(engine: Engine, batches: list[Batch]) -> list[float]:
    """Step every batch, each launched before the one ahead of it is waited for (two in flight, as the
    worker's scheduler runs them); returns each launch's host time in ms."""
    launches: list[float] = []
    pending = None
    for batch in batches:
        launched = time.perf_counter()
        lazy = engine.step(batch)
        launches.append((time.perf_counter() - launched) * 1e3)
        if pending is not None:
            pending.wait()
            pending.release()
        pending = lazy
    if pending is not None:
        pending.wait()
        pending.release()
    return launches


def engine_throughput(engine: Engine, count: int, length: int, batch_tokens: int, vocab: int, repeats: int = 3) -> float:
    rng = np.random.default_rng(count * length)
    per_batch = max(1, min(min(batch_tokens, engine.info.max_batch_tokens) // length, engine.info.max_batch_seqs))
    batches = [
        one_batch([random_ids(rng, length, vocab) for _ in range(min(per_batch, count - first))])
        for first in range(0, count, per_batch)
    ]

    def run_all() -> float:
        start = time.perf_counter()
        launch_two_deep(engine, batches)
        return time.perf_counter() - start

    run_all()
    run_all()  # warm-up and capture of every bucket
    return count / statistics.median(run_all() for _ in range(repeats))


# ---- driver ---------------------------------------------------------------------------------------


def bench_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    overrides = {"num_hidden_layers": args.layers} if args.layers else None
    start = time.perf_counter()
    path = ensure_bench_checkpoint(name, Path(args.ckpt_dir), args.device, overrides)
    pooling = BENCH_MODELS[name][2]
    result: dict[str, Any] = {"model": name, "checkpoint_s": round(time.perf_counter() - start, 1)}
    vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    lengths = [n for n in args.lengths if n <= args.max_length]
    workloads = [(c, n) for c, n in THROUGHPUT_WORKLOADS if n <= args.max_length]
    check_ids = random_ids(np.random.default_rng(99), 512, vocab)
    gate: tuple[list[np.ndarray], np.ndarray] | None = None
    if args.gate:
        inputs = gate_inputs(path, name, args)
        gate = inputs, float32_reference(path, pooling, inputs, args.device)

    if not args.skip_hf:
        model = load_reference(path, args.device, torch.bfloat16 if args.device == "cuda" else torch.float32)
        with torch.inference_mode():
            hf_check = hf_embed(model, torch.tensor(check_ids[None], dtype=torch.long, device=args.device), pooling)
        result["hf_latency_ms"] = {
            n: percentiles(hf_latency(model, pooling, n, args.hf_iters, vocab, args.device)) for n in lengths
        }
        print(f"{name} transformers latency {result['hf_latency_ms']}", flush=True)
        result["hf_throughput"] = {
            f"{c}x{n}": round(hf_throughput(model, pooling, c, n, args.batch_tokens, vocab, args.device), 1)
            for c, n in workloads
        }
        print(f"{name} transformers throughput {result['hf_throughput']}", flush=True)
        del model
        if args.device == "cuda":
            torch.cuda.empty_cache()

    for dtype in args.dtypes.split(","):
        label = f"engine {dtype}" if dtype else "engine"
        result.setdefault("engines", {})[label] = bench_engine(path, dtype or None, args, vocab, lengths, workloads,
                                                              check_ids, hf_check if not args.skip_hf else None, gate)
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return result


def bench_engine(path: Path, dtype: str | None, args: argparse.Namespace, vocab: int, lengths: list[int],
                 workloads: list[tuple[int, int]], check_ids: np.ndarray, hf_check: np.ndarray | None,
                 gate: tuple[list[np.ndarray], np.ndarray] | None) -> dict[str, Any]:
    engine = load_engine(path, device=args.device, dtype=dtype, fusion=args.fusion,
                         graph_max_tokens=args.graph_max_tokens, fp8_min_cosine=args.fp8_min_cosine)
    info = engine.info
    result: dict[str, Any] = {"engine_info": {
        "dtype": info.dtype, "fusion": info.fusion, "attention_backends": info.attention_backends,
        "max_batch_tokens": info.max_batch_tokens, "startup_s": info.startup_seconds,
        "startup_detail": info.startup_detail, "weights_bytes": info.weights_bytes,
        "activation_peak_bytes": info.activation_peak_bytes,
    }}
    engine_check = engine.step(one_batch([check_ids])).wait()
    if hf_check is not None:
        result["cosine_engine_vs_hf_bf16"] = round(float((engine_check * hf_check).sum()), 6)
    if gate is not None:
        result["gate"] = judge(engine, *gate)
        print(f"{path.name} {info.dtype} correctness gate against float32 transformers: {result['gate']}", flush=True)
    result["engine_latency_ms"], result["engine_launch_ms"] = {}, {}
    for n in lengths:
        samples, launches = engine_latency(engine, n, args.iters, vocab)
        result["engine_latency_ms"][n] = percentiles(samples)
        result["engine_launch_ms"][n] = percentiles(launches)
    print(f"{path.name} {info.dtype} engine latency {result['engine_latency_ms']}", flush=True)
    print(f"{path.name} {info.dtype} engine launch (step() return) {result['engine_launch_ms']}", flush=True)
    result["engine_throughput"] = {
        f"{c}x{n}": round(engine_throughput(engine, c, n, args.batch_tokens, vocab), 1) for c, n in workloads
    }
    print(f"{path.name} {info.dtype} engine throughput {result['engine_throughput']}", flush=True)
    if args.device == "cuda":
        from quiver.bench.engine.profile_kernels import replay_ms
        from quiver.worker.engine.engine import synthetic_batch

        for tokens in (128, 4096):
            gpu, cpu = replay_ms(engine, synthetic_batch(tokens, tokens, vocab, 0))
            result[f"replay_ms_{tokens}"], result[f"replay_cpu_ms_{tokens}"] = round(gpu, 3), round(cpu, 3)
        print(f"{path.name} {info.dtype} graph replay ms (GPU, CPU) at 128 / 4096: "
              f"{result['replay_ms_128']}, {result['replay_cpu_ms_128']} / {result['replay_ms_4096']}, "
              f"{result['replay_cpu_ms_4096']}", flush=True)
    result["engine_stats"] = engine.stats()
    result["attention_ms"] = {str(k): v for k, v in engine.selector.timings_ms.items()}
    return result


def gate_inputs(path: Path, name: str, args: argparse.Namespace) -> list[np.ndarray]:
    """The correctness gate's 12 inputs: 8 texts of the standard library's documentation, tokenized by the
    stand-in's corpus tokenizer (build_stand_in writes it beside the same weights), and token ids of the
    standard library's text at 128, 512, 1024 and 4096 tokens."""
    from quiver.bench.corpus import TokenCorpus
    from quiver.bench.stand_ins import STAND_INS, build_stand_in

    stand_in = next(key for key, (builder, _) in STAND_INS.items() if builder == name)
    build_stand_in(stand_in, Path(args.ckpt_dir), args.device)
    corpus = TokenCorpus(path / "tokenizer.json")
    texts = corpus.mixed_texts(8, 8, 256, seed=1)
    inputs = [np.asarray(e.ids, dtype=np.int32) for e in corpus.tokenizer.encode_batch(texts)]
    return inputs + [corpus.id_batch(n, 1)[0].astype(np.int32) for n in (128, 512, 1024, 4096)]


def float32_reference(path: Path, pooling: str, inputs: list[np.ndarray], device: str) -> np.ndarray:
    """transformers in float32, each input alone, pooled and normalised."""
    model = load_reference(path, device, torch.float32)
    with torch.inference_mode():
        rows = [hf_embed(model, torch.tensor(ids[None], dtype=torch.long, device=device), pooling) for ids in inputs]
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return np.concatenate(rows)


def judge(engine: Engine, inputs: list[np.ndarray], reference: np.ndarray) -> dict[str, Any]:
    rows = np.concatenate([engine.step(one_batch([ids])).wait() for ids in inputs])
    cosines = (rows * reference).sum(1) / (np.linalg.norm(rows, axis=1) * np.linalg.norm(reference, axis=1))
    return {"inputs": len(inputs), "min_cosine": round(float(cosines.min()), 6),
            "mean_cosine": round(float(cosines.mean()), 6), "passed": bool(cosines.min() >= 0.999)}


def markdown(results: list[dict[str, Any]], lengths: tuple[int, ...] = LATENCY_LENGTHS) -> str:
    lines = ["| model | runner | " + " | ".join(f"{n} tok p50 / p90 / p99 / max (ms)" for n in lengths) + " |"]
    lines.append("| --- | --- |" + " --- |" * len(lengths))
    for r in results:
        for runner, figures in _runners(r, "latency_ms"):
            cells = [
                " / ".join(str(figures[n][p]) for p in ("p50", "p90", "p99", "max")) if n in figures else "-"
                for n in lengths
            ]
            lines.append(f"| {r['model']} | {runner} | " + " | ".join(cells) + " |")
    lines += ["", "| model | runner | " + " | ".join(f"{c}x{n} (emb/s)" for c, n in THROUGHPUT_WORKLOADS) + " |"]
    lines.append("| --- | --- |" + " --- |" * len(THROUGHPUT_WORKLOADS))
    for r in results:
        for runner, figures in _runners(r, "throughput"):
            cells = [str(figures.get(f"{c}x{n}", "-")) for c, n in THROUGHPUT_WORKLOADS]
            lines.append(f"| {r['model']} | {runner} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _runners(result: dict[str, Any], figure: str) -> list[tuple[str, dict[Any, Any]]]:
    """(runner label, its figures) for transformers (when run) and each engine dtype."""
    runners = [("transformers", result[f"hf_{figure}"])] if f"hf_{figure}" in result else []
    return runners + [(label, engine[f"engine_{figure}"]) for label, engine in result.get("engines", {}).items()]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--ckpt-dir", default="/tmp/quiver-bench-ckpts")
    parser.add_argument("--models", default=",".join(BENCH_MODELS))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--iters", type=int, default=200, help="engine latency samples per length")
    parser.add_argument("--hf-iters", type=int, default=30, help="transformers latency samples per length")
    parser.add_argument("--batch-tokens", type=int, default=16384, help="tokens per batch in throughput runs")
    parser.add_argument("--max-length", type=int, default=4096, help="skip lengths above this (quick runs)")
    parser.add_argument("--lengths", type=lambda text: tuple(int(n) for n in text.split(",")), default=LATENCY_LENGTHS,
                        help="batch-1 lengths, comma-separated; one not at a graph bucket's length replays a "
                             "ragged graph (varlen attention), one at it the bucket's dense graph")
    parser.add_argument("--layers", type=int, default=0, help="override the layer count (quick runs only)")
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--dtypes", default="", help="engine dtypes to run, e.g. bfloat16,fp8 (default: the device's)")
    parser.add_argument("--fusion", default="auto", help="the engine's fusion mode (auto, triton, compile, none)")
    parser.add_argument("--graph-max-tokens", type=int, default=8192, help="largest step run from a CUDA graph")
    parser.add_argument("--fp8-min-cosine", type=float, default=0.999,
                        help="the FP8 engine's start-up accuracy check (0: time it whatever its accuracy)")
    parser.add_argument("--gate", action="store_true",
                        help="also check 12 real inputs per dtype against float32 transformers")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    env = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
    results: list[dict[str, Any]] = []
    out = Path(args.out)
    for name in args.models.split(","):
        results.append(bench_model(name, args))
        out.write_text(json.dumps({"env": env, "date": time.strftime("%Y-%m-%d"), "results": results}, indent=1))
        if args.device == "cuda":
            torch.cuda.empty_cache()
    print(markdown(results, args.lengths))


if __name__ == "__main__":
    main()
