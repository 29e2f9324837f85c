"""Scoring latency: Quiver over HTTP against Hugging Face transformers in-process, in the same run.

Model: the BGE-reranker-v2-m3 shape, XLM-RoBERTa large (24 layers, 1024 wide, 8194 positions) with a
one-label classification head, random bf16 weights written at run time (nothing is downloaded), and a
word-level tokenizer whose words are one token each, with XLM-R's "<s> a </s></s> b </s>" pairs.

Workload: one query of 16 tokens against 5, 25 and 50 documents of 512 tokens each. A Quiver request
is POST /rerank (tokenize, score, sigmoid, sort); a transformers request tokenizes the pairs, runs one
padded batch, takes the sigmoid and sorts. Both are timed end to end on the host clock, one request at
a time, after warm-up. Quiver is timed with two clients in turn: "quiver" is one keep-alive http.client
connection sending a body encoded before the clock starts (the server's figure); "quiver_httpx" is
httpx encoding the JSON body inside the timed call (this benchmark's client until 2026-12-05: about
1 ms more per 50-document request on the shared development VM).

    python -m quiver.bench.score_bench OUT.json [--device cuda] [--iters 200] [--url http://HOST:PORT]

Without --url the script starts `quiver serve` on the checkpoint itself (after the transformers runs,
so that the two never share the GPU), and stops it at the end. With --url, the server must already
serve the checkpoint this script writes into --ckpt-dir (run once without --url, or start it by hand).
Prints a Markdown table and writes every figure to OUT.json.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable

import httpx
import numpy as np
import torch

from quiver.bench.engine.checkpoints import xlmr_large_config
from quiver.bench.local_server import free_port

DOC_COUNTS = (5, 25, 50)
DOC_TOKENS = 512
QUERY_TOKENS = 16
WORDS = 1000  # tokenizer vocabulary: <s> <pad> </s> <unk>, then w4 .. w999, one token per word
MODEL_NAME = "bge-reranker-v2-m3-shape"


def percentiles(samples_ms: list[float]) -> dict[str, float]:
    values = np.asarray(samples_ms)
    stats = {p: round(float(np.percentile(values, q)), 3) for p, q in (("p50", 50), ("p90", 90), ("p99", 99))}
    return {**stats, "max": round(float(values.max()), 3), "n": len(samples_ms)}


# ---- checkpoint -----------------------------------------------------------------------------------


def write_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    words = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    words.update({f"w{i}": i for i in range(4, WORDS)})
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tokenizer.save(str(path / "tokenizer.json"))


def build_model(device: str, layers: int) -> Any:
    """XLMRobertaForSequenceClassification of the BGE-reranker-v2-m3 shape, random weights, bf16."""
    from transformers import XLMRobertaForSequenceClassification

    overrides: dict[str, Any] = {"num_labels": 1}
    if layers:
        overrides["num_hidden_layers"] = layers
    torch.manual_seed(0)
    with torch.device(device):
        model = XLMRobertaForSequenceClassification(xlmr_large_config(**overrides))
    return model.to(torch.bfloat16).eval()


def write_checkpoint(model: Any, root: Path) -> Path:
    path = root / f"{MODEL_NAME}-{model.config.num_hidden_layers}l"
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path), safe_serialization=True)
    write_tokenizer(path)
    return path


def workload(count: int, seed: int) -> tuple[str, list[str]]:
    rng = np.random.default_rng(seed)

    def text(tokens: int) -> str:
        return " ".join(f"w{i}" for i in rng.integers(4, WORDS, size=tokens))

    return text(QUERY_TOKENS), [text(DOC_TOKENS) for _ in range(count)]


# ---- transformers ------------------------------------------------------------------------------------


def hf_scores(model: Any, tokenizer: Any, query: str, documents: list[str], device: str) -> list[tuple[int, float]]:
    enc = tokenizer([query] * len(documents), documents, padding=True, return_tensors="pt").to(device)
    logits = model(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits[:, 0]
    scores = torch.sigmoid(logits.float()).cpu().numpy()
    return [(int(i), float(scores[i])) for i in np.argsort(-scores, kind="stable")]


def hf_latency(model: Any, tokenizer: Any, count: int, args: argparse.Namespace) -> tuple[list[float], list]:
    query, documents = workload(count, seed=count)
    samples: list[float] = []
    ranked: list = []
    with torch.inference_mode():
        for i in range(args.warmup + args.iters):
            start = time.perf_counter()
            ranked = hf_scores(model, tokenizer, query, documents, args.device)
            if i >= args.warmup:
                samples.append((time.perf_counter() - start) * 1e3)
    return samples, ranked


def run_transformers(model: Any, path: Path, args: argparse.Namespace) -> dict[str, Any]:
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"), pad_token="<pad>")
    latency, scores = {}, {}
    for count in DOC_COUNTS:
        samples, ranked = hf_latency(model, tokenizer, count, args)
        latency[count], scores[count] = percentiles(samples), ranked
        print(f"transformers, {count} documents: {latency[count]}", flush=True)
    return {"latency_ms": latency, "ranked": scores}


# ---- Quiver ---------------------------------------------------------------------------------------------


def start_quiver(path: Path, args: argparse.Namespace, log_path: Path) -> tuple[subprocess.Popen, str, str]:
    """`quiver serve` on the checkpoint, on free ports; returns once /health answers 200, with the URLs of
    the server and of its worker's /metrics."""
    port, worker_metrics_port = free_port(), free_port()
    argv = [sys.executable, "-m", "quiver", "serve", "--model", str(path), "--port", str(port),
            "--device", args.device, "--frontend-endpoint", f"tcp://127.0.0.1:{free_port()}",
            "--worker-endpoint", f"tcp://127.0.0.1:{free_port()}", "--worker-metrics-port", str(worker_metrics_port),
            *args.serve_args.split()]
    with open(log_path, "ab") as log:
        server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + args.startup_timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"quiver serve exited with {server.returncode}; see {log_path}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return server, url, f"http://127.0.0.1:{worker_metrics_port}/metrics"
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    stop_quiver(server)
    raise RuntimeError(f"quiver serve did not become healthy in {args.startup_timeout_s} s; see {log_path}")


def stop_quiver(server: subprocess.Popen) -> None:
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)


STAGE_HEADERS = ("x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time")


Answer = tuple[int, dict[str, str], bytes]


class RawClient:
    """One keep-alive http.client connection with the body encoded before the clock starts, as floor.py
    and hop_trace.py time requests: the figure is the server's and the socket's, not a client library's."""

    def __init__(self, url: str) -> None:
        parsed = urllib.parse.urlsplit(url)
        self.connection = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port or 80, timeout=120)

    def post(self, path: str, body: bytes) -> Answer:
        try:
            return self._post(path, body)
        except (BrokenPipeError, ConnectionResetError, http.client.RemoteDisconnected):
            # The server closed the kept-alive connection while the other client ran (its idle timeout);
            # this happens on a run's first, untimed requests.
            self.connection.close()
            return self._post(path, body)

    def _post(self, path: str, body: bytes) -> Answer:
        self.connection.request("POST", path, body, {"Content-Type": "application/json"})
        response = self.connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()

    def close(self) -> None:
        self.connection.close()


def quiver_latency(client: tuple[Callable[[dict[str, Any]], Any], Callable[[Any], Answer]], count: int,
                   args: argparse.Namespace) -> tuple[list[float], list, dict[str, dict[str, float]]]:
    """Client latencies (ms), the last ranking, and percentiles of the server's own stage times (ms, from
    its x-*-time headers: frontend total, tokenization, and the slowest chunk's worker queue and step).
    `client` is (prepare, post): prepare turns the /rerank body into what post sends, once, untimed;
    post sends it and answers (status, headers, body), timed."""
    prepare, post = client
    query, documents = workload(count, seed=count)
    body = prepare({"query": query, "texts": documents, "truncate": False})
    samples: list[float] = []
    stages: dict[str, list[float]] = {name: [] for name in STAGE_HEADERS}
    ranked: list = []
    for i in range(args.warmup + args.iters):
        start = time.perf_counter()
        status, headers, content = post(body)
        elapsed = (time.perf_counter() - start) * 1e3
        if status != 200:
            raise RuntimeError(f"/rerank answered {status}: {content[:500]!r}")
        ranked = [(r["index"], r["score"]) for r in json.loads(content)]
        if i >= args.warmup:
            samples.append(elapsed)
            for name in STAGE_HEADERS:
                stages[name].append(float(headers.get(name, "nan")))
    return samples, ranked, {name[2:-5]: percentiles(values) for name, values in stages.items()}


def read_metrics(client: httpx.Client, metrics_url: str) -> dict[str, float]:
    """Each metric's value by name from a Prometheus text page (labels dropped: a name's first series)."""
    values: dict[str, float] = {}
    for line in client.get(metrics_url).text.splitlines():
        if line and not line.startswith("#"):
            values.setdefault(line.split("{", 1)[0].split(" ", 1)[0], float(line.rsplit(" ", 1)[1]))
    return values


def first_share(client: httpx.Client, url: str) -> float | None:
    """The frontend's learned share of a long request sent before the rest tokenize (frontend/overlap.py)."""
    share = read_metrics(client, url + "/metrics").get("quiver_frontend_score_first_share")
    return None if share is None else round(share, 4)


EAGER_COUNTERS = ("quiver_worker_eager_steps_total", "quiver_worker_eager_new_shapes_total",
                  "quiver_worker_eager_warmups_total")


def eager_counts(client: httpx.Client, worker_metrics: str | None) -> dict[str, float]:
    """The worker's eager steps, those at a shape not run before, and its eager warm-ups (dense shapes set up
    on its dense-step thread) ({} for a server this script did not start: its worker's /metrics is not known)."""
    if worker_metrics is None:
        return {}
    values = read_metrics(client, worker_metrics)
    return {name[len("quiver_worker_"):-len("_total")]: values[name] for name in EAGER_COUNTERS if name in values}


def run_quiver(url: str, args: argparse.Namespace, worker_metrics: str | None = None) -> dict[str, dict[str, Any]]:
    """Quiver's figures with each client: "quiver" (http.client, the body encoded before the clock
    starts) and "quiver_httpx" (httpx encoding the body as JSON inside the timed call, as this benchmark
    measured until 2026-12-05), one document count at a time, the two clients in turn. With the worker's
    /metrics, each run also reports the eager steps it caused and how many of them met a shape for the first
    time (a step that meets its kernels' set-up on a live request)."""
    raw, library = RawClient(url), httpx.Client(timeout=120)

    def library_post(body: dict[str, Any]) -> Answer:
        response = library.post(url + "/rerank", json=body)
        return response.status_code, dict(response.headers), response.content

    runs = {"quiver": (lambda body: json.dumps(body).encode(), lambda payload: raw.post("/rerank", payload)),
            "quiver_httpx": (lambda body: body, library_post)}
    results: dict[str, dict[str, Any]] = {
        name: {"latency_ms": {}, "samples_ms": {}, "ranked": {}, "server_stages_ms": {}, "first_share": {}, "eager": {}}
        for name in runs}
    try:
        info = library.get(url + "/info").json()
        for count in DOC_COUNTS:
            for name, client in runs.items():
                eager_before = eager_counts(library, worker_metrics)
                samples, ranked, stages = quiver_latency(client, count, args)
                result = results[name]
                result["latency_ms"][count], result["ranked"][count] = percentiles(samples), ranked
                result["samples_ms"][count] = [round(sample, 3) for sample in samples]  # in order: when a slow one came
                result["server_stages_ms"][count] = stages
                result["first_share"][count] = first_share(library, url)
                result["eager"][count] = {key: value - eager_before[key]
                                          for key, value in eager_counts(library, worker_metrics).items()}
                print(f"{name}, {count} documents: {result['latency_ms'][count]}; server stages p50 ms: "
                      f"{ {stage: figures['p50'] for stage, figures in stages.items()} }; first share after: "
                      f"{result['first_share'][count]}; worker's eager counts (warm-up requests included): "
                      f"{result['eager'][count]}",
                      flush=True)
    finally:
        raw.close()
        library.close()
    for result in results.values():
        result["info"] = info
    return results


# ---- report -----------------------------------------------------------------------------------------------


def score_agreement(quiver: dict[str, Any], hf: dict[str, Any]) -> dict[int, float]:
    """Largest |score difference| per document count (both bf16: expect about 1e-2 at most)."""
    out = {}
    for count in DOC_COUNTS:
        ours, theirs = dict(quiver["ranked"][count]), dict(hf["ranked"][count])
        out[count] = round(max(abs(ours[i] - theirs[i]) for i in theirs), 5)
    return out


def markdown(results: dict[str, Any]) -> str:
    header = "| runner | " + " | ".join(f"{n} docs p50 / p90 / p99 / max (ms)" for n in DOC_COUNTS) + " |"
    lines = [f"{MODEL_NAME}, one query of {QUERY_TOKENS} tokens, documents of {DOC_TOKENS} tokens", "",
             header, "| --- |" + " --- |" * len(DOC_COUNTS)]
    for runner in ("quiver", "quiver_httpx", "transformers"):
        if runner in results:
            cells = [" / ".join(str(results[runner]["latency_ms"][n][p]) for p in ("p50", "p90", "p99", "max"))
                     for n in DOC_COUNTS]
            lines.append(f"| {runner} | " + " | ".join(cells) + " |")
    if "max_score_difference" in results:
        lines += ["", f"largest |Quiver - transformers| score: {results['max_score_difference']}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="JSON file to write")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--iters", type=int, default=200, help="timed requests per document count and runner")
    parser.add_argument("--warmup", type=int, default=20, help="untimed requests before them")
    parser.add_argument("--ckpt-dir", default="/tmp/quiver-bench-ckpts")
    parser.add_argument("--layers", type=int, default=0, help="override the 24 layers (quick runs only)")
    parser.add_argument("--url", default="", help="a running Quiver serving --ckpt-dir's checkpoint")
    parser.add_argument("--serve-args", default="", help="extra `quiver serve` options, e.g. '--workers 1'")
    parser.add_argument("--startup-timeout-s", type=float, default=600.0)
    parser.add_argument("--skip-hf", action="store_true")
    args = parser.parse_args(argv)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    model = build_model(args.device, args.layers)
    path = write_checkpoint(model, Path(args.ckpt_dir))
    results: dict[str, Any] = {
        "model": MODEL_NAME, "checkpoint": str(path), "layers": model.config.num_hidden_layers,
        "doc_tokens": DOC_TOKENS, "query_tokens": QUERY_TOKENS, "iters": args.iters, "warmup": args.warmup,
        "env": {"torch": torch.__version__,
                "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"},
        "date": time.strftime("%Y-%m-%d"),
    }
    if not args.skip_hf:
        results["transformers"] = run_transformers(model, path, args)
    del model
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()

    server = None
    url, worker_metrics = args.url, None
    if not url:
        server, url, worker_metrics = start_quiver(path, args, out.with_suffix(".serve.log"))
    try:
        results.update(run_quiver(url, args, worker_metrics))
    finally:
        if server is not None:
            stop_quiver(server)
    if "transformers" in results:
        results["max_score_difference"] = score_agreement(results["quiver"], results["transformers"])
    out.write_text(json.dumps(results, indent=1))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
