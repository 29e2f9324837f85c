"""The engine's throughput by step size: what a background step's token cap costs a bulk job.

The worker runs one step at a time (worker/scheduler.py), and its planner (worker/planner.py) caps a step's background rows: 512
tokens while online work is about, more when it has been quiet. This measures the engine alone, one
step at a time as the scheduler runs them, on the bulk benchmark's mix of lengths (log-uniform 8..512
tokens, or the model's limit), for each cap: tokens/s, texts/s, the step's p50 in ms (how long an online request arriving
just after a step began waits for it), and throughput as a share of the largest cap's, measured in the
same run, alternating caps over several rounds so that drift falls on all of them alike.

    python -m quiver.bench.step_size --model DIR --device cuda --caps 512,2048,4096,8192,16384 --out step_size.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from quiver.bench.corpus import mixed_lengths
from quiver.frontend.pipeline import split_ranges
from quiver.worker.engine import Batch, Engine, load_engine


def steps_for(lengths: list[int], cap: int, vocab: int, max_seqs: int = 1 << 30) -> list[Batch]:
    """The lengths cut into steps of at most `cap` tokens and `max_seqs` sequences, in order (one longer
    sequence alone)."""
    rng = np.random.default_rng(cap)
    seq_lens = np.asarray(lengths, dtype=np.int32)
    return [Batch(input_ids=rng.integers(10, vocab - 1, size=int(seq_lens[a:b].sum()), dtype=np.int32),
                  seq_lens=seq_lens[a:b], normalize=np.ones(b - a, dtype=bool))
            for a, b in split_ranges(seq_lens, cap, max_seqs)]


def run_steps(engine: Engine, batches: list[Batch]) -> tuple[float, list[float]]:
    """Wall seconds for the batches one after another, and each step's ms."""
    step_ms = []
    started = time.perf_counter()
    for batch in batches:
        began = time.perf_counter()
        engine.step(batch).wait()
        step_ms.append((time.perf_counter() - began) * 1000)
    return time.perf_counter() - started, step_ms


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--caps", default="512,2048,4096,8192,16384")
    parser.add_argument("--texts", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    caps = [int(c) for c in args.caps.split(",")]
    engine = load_engine(args.model, device=args.device, max_batch_tokens=max(caps))
    vocab = engine.info.model.vocab_size
    longest = min(512, engine.info.model.max_input_length)
    lengths = mixed_lengths(args.texts, 8, longest)
    work = {cap: steps_for(lengths, cap, vocab, engine.info.max_batch_seqs) for cap in caps}
    for cap in caps:  # first sight of each shape (graphs were captured at load; eager kernels warm here)
        run_steps(engine, work[cap][:20])
    seconds: dict[int, list[float]] = {cap: [] for cap in caps}
    step_ms: dict[int, list[float]] = {cap: [] for cap in caps}
    for _ in range(args.rounds):
        for cap in caps:
            wall, per_step = run_steps(engine, work[cap])
            seconds[cap].append(wall)
            step_ms[cap].extend(per_step)
    tokens = sum(lengths)
    best = max(caps)
    rows = []
    for cap in caps:
        wall = statistics.median(seconds[cap])
        rows.append({"cap": cap, "steps": len(work[cap]), "tokens_per_s": round(tokens / wall),
                     "texts_per_s": round(len(lengths) / wall, 1),
                     "step_p50_ms": round(float(np.percentile(step_ms[cap], 50)), 3),
                     "step_p99_ms": round(float(np.percentile(step_ms[cap], 99)), 3),
                     "share_of_largest": round(statistics.median(seconds[best]) / wall, 3)})
    print(f"engine throughput by step cap: {len(lengths)} texts of 8..{longest} tokens ({tokens} tokens), "
          f"median of {args.rounds} rounds, {args.device}")
    print("| cap (tokens) | steps | tokens/s | texts/s | step p50 / p99 ms | share of the largest cap |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row['cap']} | {row['steps']} | {row['tokens_per_s']:,} | {row['texts_per_s']:,} | "
              f"{row['step_p50_ms']} / {row['step_p99_ms']} | {row['share_of_largest']} |")
    if args.out:
        args.out.write_text(json.dumps({"device": args.device, "texts": len(lengths), "tokens": tokens,
                                        "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
