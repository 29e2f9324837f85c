"""How long the frontend takes to encode an embeddings answer into JSON bytes, per format and size.

It times the code the routes run (frontend.routes_embed.openai_embeddings_body and frontend.http's
encode_json) on random float32 rows, and beside it the per-number Python path it replaced
(`rows.tolist()` then JSON), so the gap is measured on the same machine in the same run.

    python -m quiver.bench.encode_bench [--rows 1 --dim 1024 --repeat 2000]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import numpy as np
import orjson

from quiver.frontend.http import encode_json
from quiver.frontend.routes_embed import openai_embeddings_body


def time_us(work: Callable[[], bytes], repeat: int) -> tuple[float, float]:
    """p50 and p99 of one call, in microseconds, after a warm-up."""
    for _ in range(min(repeat, 100)):
        work()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter_ns()
        work()
        samples.append((time.perf_counter_ns() - started) / 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def cases(rows: np.ndarray) -> dict[str, Callable[[], bytes]]:
    return {
        "float": lambda: encode_json(openai_embeddings_body(rows, "float", "m", 128)),
        "base64": lambda: encode_json(openai_embeddings_body(rows, "base64", "m", 128)),
        "float, TEI /embed": lambda: encode_json(rows),
        "float, per-number list": lambda: orjson.dumps(
            {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": row}
                                        for i, row in enumerate(rows.tolist())]}),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"{'rows x dim':>12} {'format':>22} {'p50 us':>9} {'p99 us':>9} {'bytes':>9}")
    for count in args.rows:
        rows = rng.standard_normal((count, args.dim)).astype(np.float32)
        rows /= np.linalg.norm(rows, axis=1, keepdims=True)
        for name, work in cases(rows).items():
            p50, p99 = time_us(work, args.repeat)
            print(f"{count:>5} x {args.dim:<5} {name:>22} {p50:9.1f} {p99:9.1f} {len(work()):9d}")


if __name__ == "__main__":
    main()
