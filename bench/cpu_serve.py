"""CPU throughput of `quiver serve` beside sentence-transformers' encode(), in one run.

Serves the packaged all-MiniLM-L6-v2 with N CPU workers (one thread each), sends batches of 512
real sentences of about 30 tokens to /v1/embeddings, and times the same sentences through
sentence-transformers' encode() in this process (as many threads as the workers have in all).

    python -m quiver.bench.cpu_serve [--workers 2] [--texts 512] [--tokens 30] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import httpx
import numpy as np

from quiver.bench.corpus import TokenCorpus
from quiver.bench.local_server import free_port
from quiver.common.model_info import default_model_dir


def _serve(workers: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [sys.executable, "-m", "quiver", "serve", "--workers", str(workers), "--threads", "1", "--port", str(port),
            "--frontend-endpoint", f"tcp://127.0.0.1:{free_port()}", "--worker-endpoint", f"tcp://127.0.0.1:{free_port()}",
            "--log-level", "warning"]
    server = subprocess.Popen(argv, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 120
    while time.monotonic() < end:
        try:
            health = httpx.get(url + "/health", timeout=2)
            if health.status_code == 200 and health.json()["live_workers"] == workers:
                return server, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.terminate()
    raise SystemExit("quiver serve did not become healthy")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--texts", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    model_dir = default_model_dir()
    texts = TokenCorpus(model_dir / "tokenizer.json").texts(args.tokens, args.texts)

    server, url = _serve(args.workers)
    try:
        with httpx.Client(timeout=300) as client:
            client.post(url + "/v1/embeddings", json={"input": texts})  # warm-up
            started = time.perf_counter()
            for _ in range(args.repeats):
                response = client.post(url + "/v1/embeddings", json={"input": texts})
                assert response.status_code == 200, response.text
            served_rate = args.texts * args.repeats / (time.perf_counter() - started)
            served = np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)
    finally:
        server.terminate()
        server.wait(30)

    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(args.workers)
    model = SentenceTransformer(str(model_dir), device="cpu")
    model.encode(texts[:64])
    rates = {}
    for batch_size in (32, 128):
        started = time.perf_counter()
        for _ in range(args.repeats):
            reference = model.encode(texts, batch_size=batch_size)
        rates[batch_size] = args.texts * args.repeats / (time.perf_counter() - started)
    cosine = float(np.min(np.sum(served * reference, axis=1)))
    print(f"{args.texts} texts of {args.tokens} tokens, {os.cpu_count()} CPUs, min cosine served vs encode {cosine:.6f}")
    print("| runner | emb/s |")
    print("| --- | --- |")
    print(f"| quiver serve, {args.workers} CPU workers x 1 thread, HTTP | {served_rate:.0f} |")
    for batch_size, rate in rates.items():
        print(f"| sentence-transformers encode, batch {batch_size}, {args.workers} threads | {rate:.0f} |")


if __name__ == "__main__":
    main()
