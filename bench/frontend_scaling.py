"""Requests/s of the HTTP frontend alone, as its processes grow (`quiver frontend --http-processes N`).

Starts the real broker and the real frontend on loopback, with stand-in workers that answer every
chunk at once (quiver.bench.stand_in_peers), so nothing but the frontend's CPU work — HTTP, JSON,
validation, tokenization, chunking, assembling and encoding the answer — and the hops to the broker
bound the rate. Client processes post /embed requests of a few short texts over keep-alive
connections and check that every answer is 200 with one row of the model's width per text; with
--token-ids N they post /v1/embeddings requests of N token ids each instead (no tokenization). For each
N it reports requests/s, texts/s, the client's p50/p99 and the CPU the frontend's processes used.

    python -m quiver.bench.frontend_scaling --processes 1,2,4,8 --clients 4 --connections 8 --out DIR
    python -m quiver.bench.frontend_scaling --quick --out DIR     # 1 and 2 processes, briefly, for CI
    python -m quiver.bench.frontend_scaling --processes 1 --clients 1 --connections 4 --token-ids 128
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from quiver.bench.broker_capacity import free_endpoint, start_broker
from quiver.bench.local_server import cpu_seconds, free_port
from quiver.bench.corpus import stdlib_documents
from quiver.bench.stand_in_peers import serve_stand_in_workers
from quiver.common.fingerprint import model_fingerprint


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it (Linux /proc)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo += [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                continue
    return found


def tree_cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            total += cpu_seconds(pid)
        except OSError:
            continue
    return total


def request_bodies(texts_per_request: int, count: int = 256) -> list[bytes]:
    """JSON bodies of /embed requests, each `texts_per_request` paragraphs of the standard library's docs."""
    paragraphs = [p[:400] for doc in stdlib_documents() for p in doc.split("\n\n") if len(p) > 40]
    rng = np.random.default_rng(0)
    return [json.dumps({"inputs": [paragraphs[i] for i in rng.integers(0, len(paragraphs), texts_per_request)],
                        "truncate": True}).encode() for _ in range(count)]


def token_id_bodies(texts_per_request: int, ids_per_input: int, count: int = 256) -> list[bytes]:
    """JSON bodies of /v1/embeddings requests, each `texts_per_request` inputs of `ids_per_input` token ids
    (ids 1000 and up, inside any packaged model's vocabulary); one input is sent as a flat list."""
    rng = np.random.default_rng(0)
    bodies = []
    for _ in range(count):
        rows = [[int(x) for x in rng.integers(1000, 2000, ids_per_input)] for _ in range(texts_per_request)]
        bodies.append(json.dumps({"input": rows[0] if texts_per_request == 1 else rows}).encode())
    return bodies


def _connection_loop(port: int, bodies: list[bytes], texts: int, dim: int, stop_at: float, out: list[Any],
                     path: str = "/embed") -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    latencies, failures, turn = [], 0, 0
    while time.monotonic() < stop_at:
        body = bodies[turn % len(bodies)]
        turn += 1
        started = time.monotonic()
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        payload = response.read()
        latencies.append(time.monotonic() - started)
        if response.status != 200:
            failures += 1
            continue
        rows = json.loads(payload)
        if path != "/embed":
            rows = [item["embedding"] for item in rows["data"]]
        if len(rows) != texts or any(len(row) != dim for row in rows):
            failures += 1
    connection.close()
    out.append((latencies, failures))


def drive_clients(port: int, connections: int, texts: int, dim: int, seconds: float, ready: Any, go: Any,
                  report: Any, token_ids: int = 0) -> None:
    """Process body: `connections` threads, each a keep-alive connection posting /embed (with `token_ids`,
    /v1/embeddings of that many ids per input) back to back."""
    bodies = token_id_bodies(texts, token_ids) if token_ids else request_bodies(texts)
    path = "/v1/embeddings" if token_ids else "/embed"
    ready.put(os.getpid())
    go.wait()
    stop_at = time.monotonic() + seconds
    out: list[Any] = []
    threads = [threading.Thread(target=_connection_loop, args=(port, bodies, texts, dim, stop_at, out, path))
               for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    report.put(([x for latencies, _ in out for x in latencies], sum(failures for _, failures in out)))


def wait_healthy(url: str, timeout_s: float, frontend: subprocess.Popen) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if frontend.poll() is not None:
            raise RuntimeError(f"the frontend exited with {frontend.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the frontend at {url} was not healthy within {timeout_s} s")


def measure(processes: int, args: argparse.Namespace, model: str, dim: int, broker_endpoint: str,
            log_dir: Path) -> dict[str, Any]:
    """Start a frontend of `processes` HTTP processes, drive it for args.seconds, stop it."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUIVER_")}
    with open(log_dir / f"frontend-{processes}.log", "ab") as log:
        frontend = subprocess.Popen(
            [sys.executable, "-m", "quiver", "frontend", "--broker", broker_endpoint, "--port", str(port),
             "--model", model, "--http-processes", str(processes), "--log-level", "warning",
             "--batch-runner", "inline",  # no runner process to count among the HTTP processes; it idles
             *args.frontend_args.split()],
            stdout=log, stderr=subprocess.STDOUT, env=env)
    mp = multiprocessing.get_context("spawn")
    ready, go, reports = mp.Queue(), mp.Event(), mp.Queue()
    clients = [mp.Process(target=drive_clients, daemon=True,
                          args=(port, args.connections, args.texts, dim, args.seconds, ready, go, reports,
                                args.token_ids))
               for _ in range(args.clients)]
    try:
        wait_healthy(f"http://127.0.0.1:{port}", 120.0, frontend)
        for client in clients:
            client.start()
        for _ in clients:
            ready.get(timeout=120)
        time.sleep(1.0)  # every uvicorn process has its broker link up (health answered by one of them)
        pids = descendants(frontend.pid)
        cpu = tree_cpu_seconds(pids)
        started = time.monotonic()
        go.set()
        results = [reports.get(timeout=args.seconds + 120) for _ in clients]
        wall = time.monotonic() - started
        cpu = tree_cpu_seconds(pids) - cpu
    finally:
        frontend.terminate()
        frontend.wait(30)
        for client in clients:
            client.join(5)
            if client.is_alive():
                client.kill()
    latencies = np.asarray([x for batch, _ in results for x in batch]) * 1e3
    failures = sum(f for _, f in results)
    return {"processes": processes, "requests": int(latencies.size), "failures": failures,
            "requests_per_s": round(latencies.size / wall, 1), "texts_per_s": round(latencies.size * args.texts / wall),
            "p50_ms": round(float(np.percentile(latencies, 50)), 2), "p99_ms": round(float(np.percentile(latencies, 99)), 2),
            "frontend_cores": round(cpu / wall, 2), "frontend_pids": len(pids),
            "frontend_cpu_ms_per_request": round(cpu / latencies.size * 1e3, 2) if latencies.size else None}


def markdown(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    lines = [f"| HTTP processes | requests/s ({args.texts} texts each) | texts/s | p50 ms | p99 ms | "
             "frontend CPU (cores) | frontend CPU ms per request | failed |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        lines.append(f"| {row['processes']} | {row['requests_per_s']:,} | {row['texts_per_s']:,} | {row['p50_ms']} | "
                     f"{row['p99_ms']} | {row['frontend_cores']} | {row['frontend_cpu_ms_per_request']} | "
                     f"{row['failures']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", default="1,2", help="values of --http-processes, comma-separated")
    parser.add_argument("--model", default="", help="checkpoint directory (default: the packaged MiniLM)")
    parser.add_argument("--clients", type=int, default=2, help="client processes")
    parser.add_argument("--connections", type=int, default=8, help="keep-alive connections per client process")
    parser.add_argument("--texts", type=int, default=4, help="texts per request")
    parser.add_argument("--token-ids", type=int, default=0,
                        help="post /v1/embeddings inputs of this many token ids instead of /embed texts")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each run")
    parser.add_argument("--stand-in-workers", type=int, default=2, help="stand-in workers behind the broker")
    parser.add_argument("--frontend-args", default="", help="extra options of `quiver frontend`")
    parser.add_argument("--quick", action="store_true", help="1 and 2 processes, 2 s each: a smoke run for CI")
    parser.add_argument("--out", default="", help="folder for frontend_scaling.json and .md (default: print only)")
    args = parser.parse_args(argv)
    from quiver.common.model_info import default_model_dir, load_model_info

    model = args.model or str(default_model_dir())
    dim = load_model_info(model).output_dim
    if args.quick:
        args.processes, args.seconds, args.connections = "1,2", 2.0, 4
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="quiver-frontend-scaling-"))
    out.mkdir(parents=True, exist_ok=True)
    frontend_endpoint, worker_endpoint = free_endpoint(), free_endpoint()
    broker = start_broker(frontend_endpoint, worker_endpoint, [], out / "frontend_scaling_broker.log")
    mp = multiprocessing.get_context("spawn")
    stop, served = mp.Event(), mp.Queue()
    names = [f"stand-in-{i}" for i in range(args.stand_in_workers)]
    workers = mp.Process(target=serve_stand_in_workers, daemon=True,
                         args=(worker_endpoint, names, dim, 1.0, stop, served, "", None, model_fingerprint(model)))
    workers.start()
    rows = []
    try:
        for processes in (int(x) for x in args.processes.split(",")):
            rows.append(measure(processes, args, model, dim, frontend_endpoint, out))
            print(markdown(rows[-1:], args).splitlines()[-1], flush=True)
    finally:
        stop.set()
        workers.join(10)
        broker.terminate()
        broker.wait(10)
    meta = {"cpus": os.cpu_count(), "load_average": os.getloadavg(), "model": model, "seconds": args.seconds,
            "clients": args.clients, "connections": args.connections, "texts": args.texts, "token_ids": args.token_ids}
    table = markdown(rows, args)
    if args.out:
        (out / "frontend_scaling.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        (out / "frontend_scaling.md").write_text(table + "\n")
    print(table)
    return 1 if any(row["failures"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
