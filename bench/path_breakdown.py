"""Where a batch-1 request's time goes on its way through a running Quiver.

Sends sequential token-id requests of each length to /v1/embeddings and reports, as medians: the
client's wall time, the frontend's own time (x-total-time), the worker's time from launching the
batch to reading its rows (x-inference-time) and its queueing (x-queue-time). The rest of the
frontend's time is parsing, chunking and the ZeroMQ hops through the broker; the rest of the
client's time is HTTP. Optionally times the same batches on the engine alone, in this process.

    python -m quiver.bench.path_breakdown --url http://127.0.0.1:8080 --model DIR [--engine-device cuda]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import time
from urllib.parse import urlparse

import numpy as np

HEADERS = ("x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time")


def time_server(url: str, lengths: list[int], vocab: int, requests: int) -> dict[int, dict[str, float]]:
    parsed = urlparse(url)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
    rng = np.random.default_rng(0)
    out = {}
    for length in lengths:
        ids = [int(x) for x in rng.integers(10, vocab - 1, size=length)]
        body = json.dumps({"input": [ids]}).encode()
        samples: dict[str, list[float]] = {name: [] for name in ("client", *HEADERS)}
        for index in range(requests + requests // 5):
            started = time.perf_counter()
            connection.request("POST", "/v1/embeddings", body=body, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            elapsed = (time.perf_counter() - started) * 1000
            if response.status != 200:
                raise SystemExit(f"the server answered {response.status} for {length} tokens")
            if index < requests // 5:
                continue  # warm-up: graph captures and first-sight shapes
            samples["client"].append(elapsed)
            for name in HEADERS:
                samples[name].append(float(response.getheader(name, "nan")))
        out[length] = {name: statistics.median(values) for name, values in samples.items()}
    return out


def time_engine(model: str, device: str, lengths: list[int], vocab: int, requests: int) -> dict[int, float]:
    from quiver.worker.engine import Batch, load_engine

    engine = load_engine(model, device=device)
    rng = np.random.default_rng(0)
    out = {}
    for length in lengths:
        batch = Batch(input_ids=rng.integers(10, vocab - 1, size=length).astype(np.int32),
                      seq_lens=np.array([length], dtype=np.int32), normalize=np.array([True]))
        times = []
        for index in range(requests + requests // 5):
            started = time.perf_counter()
            lazy = engine.step(batch)
            lazy.wait()
            lazy.release()
            if index >= requests // 5:
                times.append((time.perf_counter() - started) * 1000)
        out[length] = statistics.median(times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--model", required=True, help="the checkpoint the server runs (for its vocabulary)")
    parser.add_argument("--lengths", default="128,512,4096")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--engine-device", default="", help="also time the engine alone on this device")
    args = parser.parse_args()
    from quiver.common.model_info import load_model_info

    info = load_model_info(args.model)
    lengths = [n for n in (int(x) for x in args.lengths.split(",")) if n <= info.max_input_length]
    server = time_server(args.url, lengths, info.vocab_size, args.requests)
    engine = time_engine(args.model, args.engine_device, lengths, info.vocab_size, args.requests) \
        if args.engine_device else {}
    print("| tokens | client | frontend (x-total) | worker step (x-inference) | queue | engine alone |")
    print("| --- | --- | --- | --- | --- | --- |")
    for length, row in server.items():
        alone = f"{engine[length]:.3f}" if length in engine else "-"
        print(f"| {length} | {row['client']:.3f} | {row['x-total-time']:.3f} | {row['x-inference-time']:.3f} | "
              f"{row['x-queue-time']:.3f} | {alone} |")


if __name__ == "__main__":
    main()
