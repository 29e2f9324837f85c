"""BGE-M3's three outputs and contextual chunks against dense-only, on the engine, at BGE-M3's shape.

Random weights of XLM-RoBERTa large (BGE-M3's encoder, bench/engine/checkpoints.py) with random
sparse_linear / colbert_linear heads in BGE-M3's files. Measures, in one process on one device:
- batch-1 latency (p50/p99, host clock around step() + wait() and, for the token rows, the frontend's
  cutting of them into dense, sparse and ColBERT outputs) at 128 and 4096 tokens, dense only
  (pooled rows, CUDA graphs as served) against all three outputs (token rows: their own graphs up to 512
  tokens, eager above) and against the sparse output alone (the "lexical" task: each token row cut to its
  weight on the device);
- throughput (inputs/s) at 100 x 512 tokens, the three ways;
- contextual chunks: 25 documents of 16 chunks of 32 tokens, each document one 512-token sequence whose
  token rows are pooled per chunk, against 400 chunks embedded as plain 32-token sequences (on the same
  engine: its pooled path is the plain encoder's; its token rows carry one column more than a plain
  encoder's hidden states, which the pooling ignores).
Before timing, the bf16 outputs are checked against float32 on the same device (dense and mean ColBERT
cosine ≥ 0.999, lexical weights within 2 % of the largest); the run stops there when they are not.
Engine figures, not the HTTP path: the server adds its path cost (bench/RESULTS.md) to both sides.

    python -m quiver.bench.token_outputs_bench --out results.json [--root DIR] [--device cuda] [--small]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from quiver.bench.engine.checkpoints import ensure_bench_checkpoint
from quiver.bench.engine_bench import engine_throughput, one_batch, percentiles, random_ids
from quiver.bench.gate import cosines
from quiver.common.model_info import M3_HEAD_FILES
from quiver.worker.engine import Batch, Engine, load_engine



def with_m3_heads(dense_dir: Path, root: Path, hidden: int) -> Path:
    """A copy of the checkpoint (files linked) with BGE-M3's two head files beside it."""
    path = root / f"{dense_dir.name}-m3-heads"
    if (path / M3_HEAD_FILES[1]).is_file():
        return path
    path.mkdir(parents=True, exist_ok=True)
    for item in dense_dir.iterdir():
        target = path / item.name
        if not target.exists():
            target.symlink_to(item.resolve())
    torch.manual_seed(1)
    torch.save(torch.nn.Linear(hidden, 1).state_dict(), path / M3_HEAD_FILES[0])
    torch.save(torch.nn.Linear(hidden, hidden).state_dict(), path / M3_HEAD_FILES[1])
    return path


def token_batch(sequences: list[np.ndarray], lexical_only: bool = False) -> Batch:
    return Batch(input_ids=np.concatenate(sequences), seq_lens=np.array([len(s) for s in sequences], dtype=np.int32),
                 token_rows=True, lexical_only=lexical_only)


def m3_cut(rows: np.ndarray, batch: Batch, hidden: int) -> list[tuple[np.ndarray, Any, np.ndarray]]:
    """What the frontend does with BGE-M3's token rows: dense, lexical weights per token id, ColBERT."""
    from quiver.frontend.token_outputs import lexical_weights

    out, start = [], 0
    dropped = np.array([0, 1, 2, 3])
    for length in batch.seq_lens.tolist():
        seq = rows[start:start + length]
        out.append((seq[0, :hidden], lexical_weights(batch.input_ids[start:start + length], seq[:, hidden], dropped),
                    np.ascontiguousarray(seq[1:, :hidden])))
        start += length
    return out


def lexical_cut(rows: np.ndarray, batch: Batch) -> list[Any]:
    """What the frontend does with the lexical task's rows: the weights per token id of each input."""
    from quiver.frontend.token_outputs import lexical_weights

    dropped = np.array([0, 1, 2, 3])
    return [lexical_weights(batch.input_ids[a:b], rows[a:b, 0], dropped)
            for a, b in zip(batch.offsets[:-1], batch.offsets[1:])]


def timed(engine: Engine, batch: Batch, iters: int, cut: Any = None) -> list[float]:
    samples = []
    for i in range(iters + 5):
        start = time.perf_counter()
        lazy = engine.step(batch)
        rows = lazy.wait()
        if cut is not None:
            cut(rows, batch)
        lazy.release()
        if i >= 5:
            samples.append((time.perf_counter() - start) * 1e3)
    return samples


def sequential_rate(engine: Engine, batches: list[Batch], items: int, per_rows: Any) -> float:
    def run() -> float:
        start = time.perf_counter()
        for batch in batches:
            lazy = engine.step(batch)
            per_rows(lazy.wait(), batch)
            lazy.release()
        return time.perf_counter() - start

    run()
    return items / min(run() for _ in range(3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--root", type=Path, default=Path("/tmp/quiver-bench-ckpts"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="two narrow layers, for a CPU try")
    parser.add_argument("--iters", type=int, default=50)
    args = parser.parse_args()
    overrides = dict(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4) \
        if args.small else None
    dense_dir = ensure_bench_checkpoint("xlmr-large-cls", args.root, args.device, overrides)
    hidden = json.loads((dense_dir / "config.json").read_text())["hidden_size"]
    m3_dir = with_m3_heads(dense_dir, args.root, hidden)
    vocab = 30000
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else args.device}

    m3 = load_engine(m3_dir, device=args.device, fusion="none", graph_max_tokens=4096)
    reference = load_engine(m3_dir, device=args.device, dtype="float32", cuda_graphs=False, fusion="none")
    rng = np.random.default_rng(0)
    check = token_batch([random_ids(rng, n, vocab) for n in (128, 512, 37)])
    low, high = (e.step(check).wait().copy() for e in (m3, reference))
    firsts = check.offsets[:-1]
    others = np.setdiff1d(np.arange(check.num_tokens), firsts)
    pooled = m3.step(one_batch([check.input_ids[a:a + n] for a, n in zip(firsts, check.seq_lens)])).wait()
    results["check"] = {
        "dense_cos_min": float(cosines(low[firsts, :hidden], high[firsts, :hidden]).min()),
        "colbert_cos_min": float(cosines(low[others, :hidden], high[others, :hidden]).min()),
        "colbert_cos_mean": float(cosines(low[others, :hidden], high[others, :hidden]).mean()),
        "sparse_abs_max": float(np.abs(low[:, hidden] - high[:, hidden]).max()),
        "sparse_scale": float(np.abs(high[:, hidden]).max()),
        "pooled_vs_token_dense_cos_min": float(cosines(pooled[:, :hidden], low[firsts, :hidden]).min()),
    }
    del reference
    check = results["check"]
    if min(check["dense_cos_min"], check["colbert_cos_mean"], check["pooled_vs_token_dense_cos_min"]) < 0.999 \
            or check["sparse_abs_max"] > 0.02 * max(check["sparse_scale"], 1e-6):
        raise SystemExit(f"bf16 outputs diverge from float32; nothing timed: {json.dumps(check)}")
    cut = lambda rows, batch: m3_cut(rows, batch, hidden)  # noqa: E731
    for length in (128, 4096):
        ids = random_ids(np.random.default_rng(length), length, vocab)
        results[f"latency_{length}_dense_ms"] = percentiles(timed(m3, one_batch([ids]), args.iters))
        results[f"latency_{length}_all_three_ms"] = percentiles(timed(m3, token_batch([ids]), args.iters, cut))
        results[f"latency_{length}_sparse_only_ms"] = percentiles(
            timed(m3, token_batch([ids], lexical_only=True), args.iters, lexical_cut))
    results["throughput_100x512_dense_per_s"] = round(engine_throughput(m3, 100, 512, 8192, vocab), 1)
    rng = np.random.default_rng(512)
    sequences = [random_ids(rng, 512, vocab) for _ in range(100)]
    batches = [token_batch(sequences[i:i + 16]) for i in range(0, 100, 16)]
    results["throughput_100x512_all_three_per_s"] = round(sequential_rate(m3, batches, 100, cut), 1)
    lexical_batches = [token_batch(sequences[i:i + 16], lexical_only=True) for i in range(0, 100, 16)]
    results["throughput_100x512_sparse_only_per_s"] = round(sequential_rate(m3, lexical_batches, 100, lexical_cut), 1)

    rng = np.random.default_rng(32)
    documents = [[random_ids(rng, 32, vocab) for _ in range(16)] for _ in range(25)]
    results["chunks_400x32_plain_per_s"] = round(engine_throughput(m3, 400, 32, 8192, vocab), 1)
    docs = [token_batch([np.concatenate(d) for d in documents[i:i + 16]]) for i in range(0, 25, 16)]

    def pool_spans(rows: np.ndarray, batch: Batch) -> None:
        rows[:, :hidden].reshape(batch.num_seqs * 16, 32, hidden).mean(1)

    results["chunks_400x32_contextual_per_s"] = round(sequential_rate(m3, docs, 400, pool_spans), 1)
    args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
