"""The worker's planning cost on the host CPU: what the scheduler spends deciding steps, per step.

Two cases, each for several numbers of waiting chunks of one sequence each (short queries at high
concurrency are the worst case: many chunks, few tokens):
  - a full plan (`next_batch`): the step taken from N waiting chunks, gathered into one batch;
  - arrivals during a running step: N chunks arriving one at a time, each followed by the closed-only
    plan the loop asks for (`next_batch(closed_only=True)`), as `Scheduler._while_step_runs` does.
The second is measured twice in the same run: as the scheduler runs it, and with the bound check that
spares a plan while too little waits to close a step turned off (every arrival planned in full).
The engine is the packaged model on CPU; no step is run, so the figures are the host's planning alone.

    python -m quiver.bench.plan_cost [--tokens 32] [--chunks 16,64,256] [--repeats 50]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from quiver.common.model_info import default_model_dir
from quiver.common.protocol import Chunk
from quiver.worker.engine import Engine, load_engine
from quiver.worker.scheduler import Scheduler


def _chunk(index: int, tokens: int) -> Chunk:
    return Chunk(chunk_id=f"c{index}", task="embed", num_seqs=1, num_tokens=tokens, normalize=True, timeout_s=30.0,
                 input_ids=np.full(tokens, 1000, dtype=np.int32), seq_lens=np.array([tokens], dtype=np.int32))


def _scheduler(engine: Engine) -> Scheduler:
    """The budgets a GPU worker runs with by default (16,384 tokens, 256 sequences, 4,096 shared)."""
    return Scheduler(engine, send=lambda message: None, worker_name="bench", max_batch_tokens=16384,
                     max_batch_seqs=256, shared_step_tokens=4096)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32, help="tokens of each chunk's one sequence")
    parser.add_argument("--chunks", default="16,64,256", help="numbers of waiting chunks")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    engine = load_engine(default_model_dir(), device="cpu")
    chunks = {n: [_chunk(i, args.tokens) for i in range(n)] for n in map(int, args.chunks.split(","))}

    def full_plan(n: int) -> float:
        scheduler = _scheduler(engine)
        for chunk in chunks[n]:
            scheduler.accept(chunk)
        started = time.perf_counter()
        scheduler.next_batch()
        return time.perf_counter() - started

    def arrivals(n: int, bound_check: bool) -> float:
        scheduler = _scheduler(engine)
        if not bound_check:
            scheduler.planner._could_close = lambda: True  # type: ignore[method-assign]
        elapsed = 0.0
        for chunk in chunks[n]:
            scheduler.accept(chunk)
            started = time.perf_counter()
            scheduler.next_batch(closed_only=True)
            elapsed += time.perf_counter() - started
        return elapsed

    print(f"| N waiting chunks of {args.tokens} tokens | full plan µs | N arrivals' closed-only plans, µs in all: "
          "bound check on / off | on / off |")
    print("| --- | --- | --- | --- |")
    for n in chunks:
        full_plan(n), arrivals(n, True), arrivals(n, False)  # warm-up
        # Alternated so that a host's drift falls on all alike.
        full, on, off = [], [], []
        for _ in range(args.repeats):
            full.append(full_plan(n))
            on.append(arrivals(n, True))
            off.append(arrivals(n, False))
        full_us, on_us, off_us = (statistics.median(times) * 1e6 for times in (full, on, off))
        print(f"| {n} | {full_us:.0f} | {on_us:.0f} / {off_us:.0f} | ×{on_us / off_us:.2f} |")


if __name__ == "__main__":
    main()
