"""Bulk jobs against a running Quiver: `quiver embed` beside the bulk benchmark's client, and the online
p99 with and without a Batch API job running.

    python -m quiver.bench.bulk_jobs --url http://127.0.0.1:8080 --texts 4000 --out bench/out/bulk_jobs

Throughput: the same mixed-length corpus as `quiver bench`'s bulk benchmark (TokenCorpus.mixed_texts),
sent the way that benchmark sends it (CLIENTS clients taking 64-text batches from one queue,
POST /v1/embeddings), then embedded by `quiver embed` from a Parquet file with the same batch size
and concurrency; the two alternate `--rounds` times and the medians are compared. `quiver embed`'s
time is its own report (reading, requests, committed parts and the assembled output).

`quiver embed` runs at its default, background priority (or `--embed-priority online`), after
ONLINE_PAUSE_S without online traffic (a bulk job alone on the server, as when re-indexing overnight).

Priority: `--online-clients` clients each send single texts of `--online-length` tokens one after
another (`--online-requests` in all) and record each latency, first on the idle server, then while a
Batch API job of `--batch-lines` lines (`--batch-length` tokens each, or the mixed corpus) runs, same
server, same run; the report gives p50/p99 of both, the ratio of the p99s (target ≤ 1.2) and how many
batch lines completed during the measurement (the batch must progress, not merely wait).

    python -m quiver.bench.bulk_jobs --quick      # a first look on a CPU test cluster
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from quiver.bench.corpus import TokenCorpus
from quiver.common.model_info import default_model_dir, load_model_info

CLIENTS = 4
BATCH = 64
ONLINE_PAUSE_S = 2.5  # longer than the worker's window of recent online work (worker/planner.py)
DISTINCT_BATCH_TEXTS = 512  # batch lines cycle through this many texts (making many long texts is slow)


async def bulk_client_texts_per_s(url: str, texts: list[str]) -> float:
    batches = [texts[i:i + BATCH] for i in range(0, len(texts), BATCH)]
    queue: asyncio.Queue[list[str]] = asyncio.Queue()
    for batch in batches:
        queue.put_nowait(batch)
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        for batch in batches[:2]:
            (await client.post("/v1/embeddings", json={"input": batch})).raise_for_status()

        async def drain() -> None:
            while not queue.empty():
                batch = queue.get_nowait()
                (await client.post("/v1/embeddings", json={"input": batch})).raise_for_status()

        started = time.perf_counter()
        await asyncio.gather(*(drain() for _ in range(CLIENTS)))
        return len(texts) / (time.perf_counter() - started)


def embed_texts_per_s(url: str, corpus: Path, output: Path, count: int, priority: str = "background",
                      concurrency: int = CLIENTS) -> tuple[float, float]:
    """`quiver embed`'s texts/s over its whole run (reading, writing the output) and over its embedding phase."""
    for leftover in output.parent.glob(output.name + "*"):
        shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
    time.sleep(ONLINE_PAUSE_S)
    done = subprocess.run([sys.executable, "-m", "quiver", "embed", str(corpus), "-o", str(output), "--url", url,
                           "--batch-size", str(BATCH), "--concurrency", str(concurrency), "--no-progress",
                           "--priority", priority],
                          capture_output=True, text=True, check=True)
    total_s, embedding_s = re.search(r"in ([0-9.]+) s \(([0-9.]+) s embedding", done.stderr).groups()  # type: ignore[union-attr]
    return count / float(total_s), count / float(embedding_s)


def summary(latencies: list[float]) -> dict[str, float]:
    values = np.asarray(latencies)
    return {"p50_ms": round(float(np.percentile(values, 50)), 2), "p99_ms": round(float(np.percentile(values, 99)), 2),
            "mean_ms": round(float(values.mean()), 2), "requests": len(latencies)}


STAGE_HEADERS = {"frontend": "x-total-time", "tokenization": "x-tokenization-time", "worker_queue": "x-queue-time",
                 "step": "x-inference-time"}


async def online_latencies_ms(url: str, texts: list[str], clients: int, requests: int,
                              stages: dict[str, list[float]] | None = None) -> list[float]:
    """Latencies of `requests` single-text requests from `clients` clients, each sending one after another.
    With `stages`, each response's stage headers (frontend total, tokenization, worker queue, step) go there too."""
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        async def one_client(offset: int) -> None:
            for i in range(offset, requests, clients):
                started = time.perf_counter()
                response = await client.post("/v1/embeddings", json={"input": texts[i % len(texts)]})
                response.raise_for_status()
                latencies.append((time.perf_counter() - started) * 1000)
                if stages is not None:
                    for stage, header in STAGE_HEADERS.items():
                        stages.setdefault(stage, []).append(float(response.headers.get(header, "nan")))

        await asyncio.gather(*(one_client(k) for k in range(clients)))
    return latencies


def online_phase(url: str, texts: list[str], clients: int, requests: int) -> dict[str, Any]:
    """One phase of online traffic: the client's p50/p99, and the same for each stage the server reports
    (so that a slower phase shows where: the frontend's own time, tokenization, the worker's queue or the step)."""
    stages: dict[str, list[float]] = {}
    result: dict[str, Any] = summary(asyncio.run(online_latencies_ms(url, texts, clients, requests, stages)))
    result["stages"] = {stage: summary(values) for stage, values in stages.items()}
    return result


def chunks_sent(url: str) -> float:
    """The frontend's count of chunks sent to the broker (online and background alike)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("quiver_frontend_chunks_sent_total"))


def start_batch(url: str, texts: list[str], count: int) -> str:
    lines = "\n".join(json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v1/embeddings",
                                  "body": {"input": texts[i % len(texts)]}}) for i in range(count))
    response = httpx.post(url + "/v1/files", files={"file": ("batch.jsonl", io.BytesIO(lines.encode()))},
                          data={"purpose": "batch"}, timeout=120)
    if response.status_code != 200:
        raise SystemExit(f"the batch input was refused: {response.status_code} {response.text}")
    uploaded = response.json()
    batch = httpx.post(url + "/v1/batches", json={"input_file_id": uploaded["id"], "endpoint": "/v1/embeddings",
                                                 "completion_window": "24h"}).json()
    while batch["status"] == "validating" or batch["request_counts"]["completed"] == 0:
        time.sleep(0.1)
        batch = httpx.get(f"{url}/v1/batches/{batch['id']}").json()
    return str(batch["id"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--model", type=Path, default=None,
                        help="the server's checkpoint, for its tokenizer (default: the packaged model)")
    parser.add_argument("--texts", type=int, default=4000, help="texts in the throughput corpus")
    parser.add_argument("--max-length", type=int, default=128, help="longest corpus text, in tokens (shortest: 8)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternating rounds of the two throughput measurements (0: skip them)")
    parser.add_argument("--embed-priority", default="background", choices=("background", "online"),
                        help="the priority `quiver embed` sends its requests at")
    parser.add_argument("--embed-concurrency", type=int, default=CLIENTS,
                        help=f"requests `quiver embed` keeps in flight (default {CLIENTS}, the bulk client's; "
                             "`quiver embed`'s own default is 8)")
    parser.add_argument("--online-requests", type=int, default=400, help="online requests in each phase")
    parser.add_argument("--online-clients", type=int, default=CLIENTS, help="online clients, each sequential")
    parser.add_argument("--online-length", type=int, default=16, help="tokens of each online text")
    parser.add_argument("--batch-lines", type=int, default=20000)
    parser.add_argument("--batch-length", type=int, default=0,
                        help="tokens of each batch line's text (0: the mixed corpus of 8..--max-length)")
    parser.add_argument("--quick", action="store_true",
                        help="a first look: 400 texts, one round, 200 online requests, a 3,000-line batch")
    parser.add_argument("--out", type=Path, default=Path("bench/out/bulk_jobs"))
    args = parser.parse_args(argv)
    if args.quick:  # smaller defaults; options given explicitly still win
        parser.set_defaults(texts=400, rounds=1, online_requests=200, batch_lines=3000)
        args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_model_info(args.model or default_model_dir()).tokenizer_path
    texts = TokenCorpus(tokenizer).mixed_texts(args.texts, 8, args.max_length)
    results: dict[str, Any] = {"url": args.url, "texts": args.texts, "max_length": args.max_length,
                               "clients": CLIENTS, "batch": BATCH, "embed_priority": args.embed_priority,
                               "embed_concurrency": args.embed_concurrency,
                               "online_clients": args.online_clients,
                               "online_length": args.online_length, "batch_lines": args.batch_lines,
                               "batch_length": args.batch_length or f"8..{args.max_length}"}

    import pyarrow as pa
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as scratch:
        corpus = Path(scratch) / "corpus.parquet"
        pq.write_table(pa.table({"text": texts}), corpus)
        client_rates, embed_rates, embed_phase_rates = [], [], []
        for _ in range(args.rounds):
            client_rates.append(asyncio.run(bulk_client_texts_per_s(args.url, texts)))
            whole, phase = embed_texts_per_s(args.url, corpus, Path(scratch) / "out.parquet", len(texts),
                                             args.embed_priority, args.embed_concurrency)
            embed_rates.append(whole)
            embed_phase_rates.append(phase)
            print(f"bulk client {client_rates[-1]:.1f} texts/s, quiver embed {whole:.1f} texts/s "
                  f"({phase:.1f} while embedding)", flush=True)
    if args.rounds:
        results["bulk_client_texts_per_s"] = [round(r, 1) for r in client_rates]
        results["quiver_embed_texts_per_s"] = [round(r, 1) for r in embed_rates]
        results["quiver_embed_embedding_phase_texts_per_s"] = [round(r, 1) for r in embed_phase_rates]
        results["embed_over_bulk"] = round(statistics.median(embed_rates) / statistics.median(client_rates), 3)
        results["embed_phase_over_bulk"] = round(statistics.median(embed_phase_rates) / statistics.median(client_rates), 3)

    corpus = TokenCorpus(tokenizer)
    online_texts = corpus.texts(args.online_length, min(args.online_requests, 256))
    distinct = min(args.batch_lines, DISTINCT_BATCH_TEXTS)
    batch_texts = (corpus.texts(args.batch_length, distinct) if args.batch_length
                   else corpus.mixed_texts(distinct, 8, args.max_length, seed=1))
    asyncio.run(online_latencies_ms(args.url, online_texts, args.online_clients, 2 * args.online_clients))  # warm
    results["online_idle"] = online_phase(args.url, online_texts, args.online_clients, args.online_requests)
    batch_id = start_batch(args.url, batch_texts, args.batch_lines)
    before = httpx.get(f"{args.url}/v1/batches/{batch_id}").json()["request_counts"]["completed"]
    chunks_before = chunks_sent(args.url)
    started = time.perf_counter()
    results["online_during_batch"] = online_phase(args.url, online_texts, args.online_clients, args.online_requests)
    seconds = time.perf_counter() - started
    # Each online request is one chunk; the rest are the batch's (its lines are committed in parts of
    # hundreds, too coarse to show progress over a few seconds).
    results["batch_chunks_sent_during_measurement"] = int(chunks_sent(args.url) - chunks_before - args.online_requests)
    batch = httpx.get(f"{args.url}/v1/batches/{batch_id}").json()
    results["batch_still_running_at_end"] = batch["status"] == "in_progress"
    done = batch["request_counts"]["completed"] - before
    results["batch_lines_done_during_measurement"] = done
    results["batch_lines_per_s_during_measurement"] = round(done / seconds, 1)
    httpx.post(f"{args.url}/v1/batches/{batch_id}/cancel")
    results["p99_ratio"] = round(results["online_during_batch"]["p99_ms"] / results["online_idle"]["p99_ms"], 3)
    results["p50_ratio"] = round(results["online_during_batch"]["p50_ms"] / results["online_idle"]["p50_ms"], 3)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
