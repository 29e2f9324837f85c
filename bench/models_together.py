"""Two models on one GPU against each served alone: batch-1 latency through the whole HTTP path.

Three `quiver serve` processes share the device: one serves the embedder stand-in alone, one the
reranker stand-in alone, one both (each model's worker with its share of the GPU's memory). Once all
are healthy, each model is timed on the server it has alone and on the shared one, in alternating
rounds (so drift over the run falls on both sides), one request at a time on a kept-alive connection:
the embedder with a pre-tokenized input of --tokens ids (/v1/embeddings), the reranker with one
query and one document (/v1/rerank). The other servers are idle meanwhile. Prints a table of p50 and
p99 per model and server and the ratio together / alone, and writes it as JSON.

    python -m quiver.bench.models_together --device cuda --out /tmp/out
    python -m quiver.bench.models_together --device cpu --small   # tries it on a CPU
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from quiver.bench.local_server import free_port
from quiver.bench.stand_ins import build_stand_in

EMBEDDER, RERANKER = "pplx-embed-0.6b-shape", "bge-reranker-v2-m3-shape"
NAMES = {EMBEDDER: "embedder", RERANKER: "reranker"}
QUERY = "how do the workers of two models share one graphics processor"
DOCUMENT = ("Each model's worker is a process of its own with its share of the device's memory; the broker "
            "keeps a pool of workers per model and sends every chunk to a worker of the model it names. ") * 3


def start_server(config: Path, port: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "quiver", "serve", "--config", str(config), "--port", str(port),
            "--broker-metrics-port", "0", "--worker-metrics-port", "0"]
    with open(log, "wb") as out:
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def write_config(path: Path, models: list[tuple[Path, str]], device: str, share: float) -> Path:
    lines = []
    for checkpoint, name in models:
        lines += ["[[models]]", f"model = {json.dumps(str(checkpoint))}", f"served_model_name = {json.dumps(name)}",
                  f"device = {json.dumps(device)}"]
        if device != "cpu":
            lines.append(f"gpu_memory_fraction = {share}")
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def healthy(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except OSError:
        return False


def request_body(model: str, tokens: int) -> tuple[str, bytes]:
    if model == "embedder":
        return "/v1/embeddings", json.dumps({"model": model, "input": list(range(100, 100 + tokens))}).encode()
    return "/v1/rerank", json.dumps({"model": model, "query": QUERY, "documents": [DOCUMENT]}).encode()


def time_requests(port: int, model: str, tokens: int, count: int) -> list[float]:
    path, body = request_body(model, tokens)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/json"}
    times = []
    for _ in range(count):
        started = time.perf_counter()
        conn.request("POST", path, body, headers)
        response = conn.getresponse()
        payload = response.read()
        times.append(time.perf_counter() - started)
        if response.status != 200:
            raise RuntimeError(f"{model} on port {port}: {response.status} {payload[:300]!r}")
    conn.close()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="narrow two-layer stand-ins, for a CPU")
    parser.add_argument("--tokens", type=int, default=128, help="tokens of the embedder's input")
    parser.add_argument("--requests", type=int, default=200, help="timed requests per model and server")
    parser.add_argument("--rounds", type=int, default=4, help="alternations of the alone and shared servers")
    parser.add_argument("--warmup", type=int, default=20, help="untimed requests per model and server")
    parser.add_argument("--share", type=float, default=0.2, help="GPU memory fraction of each worker")
    parser.add_argument("--start-timeout-s", type=float, default=300.0)
    parser.add_argument("--out", default="", help="folder for models_together.json and the servers' logs")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="quiver-models-"))
    out = Path(args.out) if args.out else work
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    checkpoints = {name: build_stand_in(name, work / "ckpts", args.device, args.small) for name in NAMES}
    print(f"stand-ins written in {time.monotonic() - started:.1f} s", flush=True)
    device = "cpu" if args.device == "cpu" else "cuda:0"
    layouts = {
        "embedder alone": [(checkpoints[EMBEDDER], "embedder")],
        "reranker alone": [(checkpoints[RERANKER], "reranker")],
        "together": [(checkpoints[EMBEDDER], "embedder"), (checkpoints[RERANKER], "reranker")],
    }
    ports = {layout: free_port() for layout in layouts}
    servers = {layout: start_server(write_config(work / f"{layout.replace(' ', '-')}.toml", models, device, args.share),
                                    ports[layout], out / f"serve-{layout.replace(' ', '-')}.log")
               for layout, models in layouts.items()}
    try:
        deadline = time.monotonic() + args.start_timeout_s
        while not all(healthy(port) for port in ports.values()):
            for layout, proc in servers.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"the {layout} server exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError("the servers did not become healthy in time")
            time.sleep(0.5)
        print(f"servers healthy {time.monotonic() - started:.1f} s after the start", flush=True)
        plan = [("embedder", "embedder alone"), ("embedder", "together"),
                ("reranker", "reranker alone"), ("reranker", "together")]
        for model, layout in plan:
            time_requests(ports[layout], model, args.tokens, args.warmup)
        samples: dict[tuple[str, str], list[float]] = {key: [] for key in plan}
        per_round = max(1, args.requests // args.rounds)
        for round_index in range(args.rounds):
            order = plan if round_index % 2 == 0 else plan[::-1]
            for model, layout in order:
                samples[(model, layout)] += time_requests(ports[layout], model, args.tokens, per_round)
        rows: list[dict[str, float | int | str]] = []
        for model, layout in plan:
            values = np.array(samples[(model, layout)]) * 1000
            rows.append({"model": model, "server": layout, "requests": len(values),
                         "p50_ms": float(np.percentile(values, 50)), "p99_ms": float(np.percentile(values, 99))})
        print("| model | served | requests | p50 ms | p99 ms | p50 together / alone |\n| --- | --- | --- | --- | --- | --- |")
        for row in rows:
            alone = next(r for r in rows if r["model"] == row["model"] and r["server"] != "together")
            ratio = float(row["p50_ms"]) / float(alone["p50_ms"]) if row["server"] == "together" else 1.0
            row["ratio_p50"] = ratio
            print(f"| {row['model']} | {row['server']} | {row['requests']} | {row['p50_ms']:.2f} | "
                  f"{row['p99_ms']:.2f} | {ratio:.3f} |")
        (out / "models_together.json").write_text(json.dumps({"device": args.device, "tokens": args.tokens,
                                                              "rows": rows}, indent=1))
        return 0
    finally:
        for proc in servers.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in servers.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
