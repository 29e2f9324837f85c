"""How long the frontend's tokenizer takes on a rerank request's pairs, and how it scales with threads.

Times what the frontend's TextTokenizer.encode_sync does with pairs (the tokenizers library's
encode_batch_fast in the pair template, then each encoding's ids and segment ids as lists), and the same
with encode_batch (which also finds each token's character offsets), on score_bench's
workload (one query of 16 tokens against 5 / 25 / 50 documents of 512) and tokenizer, once per
RAYON_NUM_THREADS setting, each in a fresh process (the tokenizers library sizes its pool once).

    python -m quiver.bench.pair_tokenization [--threads 1,4,0] [--repeat 50]     (0: the library's default)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


METHODS = ("encode_batch_fast", "encode_batch")


def measure(repeat: int) -> dict[str, float]:
    """ms per batch of pairs (median) by method and document count, in this process."""
    from tokenizers import Tokenizer

    from quiver.bench import score_bench

    with tempfile.TemporaryDirectory() as scratch:
        score_bench.write_tokenizer(Path(scratch))
        tokenizer = Tokenizer.from_file(str(Path(scratch) / "tokenizer.json"))
    out = {}
    for method in METHODS:
        encode = getattr(tokenizer, method)
        for count in score_bench.DOC_COUNTS:
            query, documents = score_bench.workload(count, seed=count)
            pairs = [(query, document) for document in documents]
            times = []
            for _ in range(repeat + 3):
                start = time.perf_counter()
                encodings = encode(pairs, add_special_tokens=True)
                [e.ids for e in encodings], [e.type_ids for e in encodings]
                times.append((time.perf_counter() - start) * 1e3)
            out[f"{method} {count}"] = round(statistics.median(times[3:]), 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="1,4,0")
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.repeat)))
        return
    from quiver.bench.score_bench import DOC_COUNTS

    columns = [f"{method}, {count} pairs" for method in METHODS for count in DOC_COUNTS]
    print(f"| RAYON_NUM_THREADS | {' | '.join(columns)} |")
    print("| --- |" + " --- |" * len(columns))
    for threads in args.threads.split(","):
        env = dict(os.environ)
        env.pop("RAYON_NUM_THREADS", None)
        if threads != "0":
            env["RAYON_NUM_THREADS"] = threads
        done = subprocess.run([sys.executable, "-m", "quiver.bench.pair_tokenization", "--child",
                               "--repeat", str(args.repeat)], env=env, capture_output=True, text=True, check=True)
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"| {threads if threads != '0' else f'default ({os.cpu_count()} CPUs)'} | "
              + " | ".join(str(v) for v in figures.values()) + " |", flush=True)


if __name__ == "__main__":
    main()
