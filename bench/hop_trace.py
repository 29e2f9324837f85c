"""Where a batch-1 request's time goes, hop by hop, through a real `quiver serve`.

Starts `quiver serve` with a tracer preloaded into each of its processes (a sitecustomize module on
PYTHONPATH, written to a temporary folder; nothing of it is in the served code): every protocol message
sent (stamped as the send begins) or received (stamped once it is in), and a few stage entries (the
frontend's body parse and answer encoding, the worker scheduler's intake, launch, step end and answer),
are logged with time.monotonic_ns, which on Linux is one clock for every process of the host. Then
sequential token-id requests go to /v1/embeddings, and each request's events are lined up into one
timeline: p50 / p90 µs of every segment, per length.

    python -m quiver.bench.hop_trace --device cuda --model DIR --lengths 128,512,4096 --requests 200
    python -m quiver.bench.hop_trace --quick          # the packaged model on the CPU, a few requests

The tracer's own writes (a line to a file per event, ~5-20 µs) are inside the segments: compare
segments with each other and across runs of this tool, not with untraced figures.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from quiver.bench.local_server import free_port, wait_http

# Loaded by every Python process that starts with the tracing folder on PYTHONPATH and HOPTRACE set.
TRACER = '''
import os, sys
if os.environ.get("HOPTRACE"):
    import functools, threading, time
    import quiver.common.transport as transport
    _out = open(os.path.join(os.environ["HOPTRACE"], f"{os.getpid()}.log"), "a", buffering=1)

    def _log(what):
        _out.write(f"{time.monotonic_ns()} {os.getpid()} {threading.current_thread().name} {what}\\n")

    _send, _recv = transport.send_frames, transport.recv_frames

    def send_frames(sock, frames, identity=None, flags=0):
        _log(f"send{len(frames)}")  # before the send: the peer's receive must never be stamped earlier
        _send(sock, frames, identity, flags)

    def recv_frames(sock, flags=transport._NOBLOCK):
        frames = _recv(sock, flags)
        _log(f"recv{len(frames)}")
        return frames

    transport.send_frames, transport.recv_frames = send_frames, recv_frames

    def _on_entry(owner, name, label):
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            _log(label)
            return original(*args, **kwargs)

        setattr(owner, name, wrapper)

    if "worker" in sys.orig_argv:
        import quiver.worker.scheduler as scheduler
        for name, label in (("accept", "W.accept"), ("launch", "W.launch"), ("_count_busy", "W.done"),
                            ("_answer", "W.answer")):
            _on_entry(scheduler.Scheduler, name, label)
    if "frontend" in sys.orig_argv:
        import quiver.frontend.http as http
        import quiver.frontend.routes_embed as routes_embed
        _on_entry(http, "parse_body", "F.parse")
        _on_entry(routes_embed, "openai_embeddings_body", "F.encode")
'''

# (process role, event) -> segment boundary, in the order a request meets them.
BOUNDARIES = {("F", "F.parse"): "F.parse", ("F", "send4"): "F.send", ("B", "recv5"): "B.recv_chunk",
              ("B", "send4"): "B.send_chunk", ("W", "recv4"): "W.link_recv", ("W", "W.accept"): "W.accept",
              ("W", "W.launch"): "W.launch", ("W", "W.done"): "W.done", ("W", "W.answer"): "W.answer",
              ("W", "send3"): "W.send", ("B", "recv4"): "B.recv_result", ("B", "send3"): "B.send_result",
              ("F", "recv3"): "F.recv", ("F", "F.encode"): "F.encode"}
ORDER = ["C.start", *BOUNDARIES.values(), "C.end"]
WARMUP = 10


def _roles(events: list[tuple[int, str, str, str]]) -> dict[str, str]:
    """pid -> F (frontend), B (broker) or W (worker), from what each process logged."""
    seen: dict[str, set[tuple[str, str]]] = collections.defaultdict(set)
    for _, pid, thread, what in events:
        seen[pid].add((thread, what))
    roles = {}
    for pid, kinds in seen.items():
        if any(what.startswith("W.") for _, what in kinds):
            roles[pid] = "W"
        elif any(what.startswith("F.") for _, what in kinds):
            roles[pid] = "F"
        elif ("MainThread", "recv5") in kinds:
            roles[pid] = "B"
    return roles


def timelines(trace_dir: Path, requests: list[tuple[int, int, int]]) -> dict[int, np.ndarray]:
    """Per length, an array [requests, len(ORDER)] of event times (ns); requests whose events are not all
    found (a heartbeat in the way, say) are left out."""
    events = []
    for path in trace_dir.glob("*.log"):
        for line in path.read_text().splitlines():
            ns, pid, thread, what = line.split()
            events.append((int(ns), pid, thread, what))
    events.sort()
    roles = _roles(events)
    # A worker whose broker socket has a thread of its own (worker/link.py) sends a result twice: the
    # scheduler's push into the outbox, then that thread's send to the broker; only the second counts.
    threaded = {pid for _, pid, thread, _ in events if thread == "broker-link"}
    times = np.array([event[0] for event in events], dtype=np.int64)
    out: dict[int, list[list[int]]] = collections.defaultdict(list)
    for started, ended, length in requests:
        got = {"C.start": started, "C.end": ended}
        for ns, pid, thread, what in events[np.searchsorted(times, started):np.searchsorted(times, ended, "right")]:
            if pid in threaded and what == "send3" and thread != "broker-link":
                continue  # the scheduler's push into the worker's outbox, not the send to the broker
            name = BOUNDARIES.get((roles.get(pid, ""), what))
            if name is not None and name not in got:
                got[name] = ns
        if len(got) == len(ORDER):
            out[length].append([got[name] for name in ORDER])
    return {length: np.array(rows[WARMUP:], dtype=np.int64) for length, rows in out.items()}


def segments(rows: np.ndarray) -> list[dict[str, Any]]:
    table = []
    for i in range(1, len(ORDER)):
        gaps = (rows[:, i] - rows[:, i - 1]) / 1e3
        table.append({"from": ORDER[i - 1], "to": ORDER[i], "p50_us": round(float(np.percentile(gaps, 50)), 1),
                      "p90_us": round(float(np.percentile(gaps, 90)), 1)})
    total = (rows[:, -1] - rows[:, 0]) / 1e3
    table.append({"from": "C.start", "to": "C.end", "p50_us": round(float(np.percentile(total, 50)), 1),
                  "p90_us": round(float(np.percentile(total, 90)), 1)})
    return table


def _send_requests(port: int, lengths: list[int], count: int, vocab: int) -> list[tuple[int, int, int]]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    rng = np.random.default_rng(0)
    done = []
    for length in lengths:
        body = json.dumps({"input": [[int(x) for x in rng.integers(5, vocab - 1, size=length)]]}).encode()
        for _ in range(count + WARMUP):
            time.sleep(0.002)  # every process idle again, as between a user's requests
            started = time.monotonic_ns()
            connection.request("POST", "/v1/embeddings", body=body, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"/v1/embeddings answered {response.status} for {length} tokens")
            done.append((started, time.monotonic_ns(), length))
    return done


def run(args: argparse.Namespace) -> dict[int, list[dict[str, Any]]]:
    from quiver.common.model_info import default_model_dir, load_model_info

    info = load_model_info(args.model or default_model_dir())
    lengths = [n for n in args.lengths if n <= info.max_input_length]
    with tempfile.TemporaryDirectory(prefix="quiver-hop-trace-") as folder:
        site, trace = Path(folder, "site"), Path(folder, "trace")
        site.mkdir()
        trace.mkdir()
        (site / "sitecustomize.py").write_text(TRACER)
        env = dict(os.environ, HOPTRACE=str(trace),
                   PYTHONPATH=os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]))
        port = free_port()
        command = [sys.executable, "-m", "quiver", "serve", "--port", str(port), "--device", args.device,
                   *(["--model", args.model] if args.model else []), *args.serve_args.split()]
        server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_http(port, "/health", args.startup_timeout_s, server)
            requests = _send_requests(port, lengths, args.requests, info.vocab_size)
        finally:
            server.terminate()
            server.wait(60)
        return {length: segments(rows) for length, rows in timelines(trace, requests).items() if len(rows)}


def markdown(result: dict[int, list[dict[str, Any]]]) -> str:
    lengths = sorted(result)
    lines = ["| segment | " + " | ".join(f"{n} tokens, p50 / p90 µs" for n in lengths) + " |",
             "| --- |" + " --- |" * len(lengths)]
    for i, row in enumerate(result[lengths[0]]):
        cells = " | ".join(f"{result[n][i]['p50_us']} / {result[n][i]['p90_us']}" for n in lengths)
        lines.append(f"| {row['from']} → {row['to']} | {cells} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the packaged model on the CPU, 20 requests of 32 tokens")
    parser.add_argument("--device", default="", help="device of `quiver serve` (default: cuda if visible, else cpu)")
    parser.add_argument("--model", default="", help="checkpoint to serve (default: the packaged all-MiniLM-L6-v2)")
    parser.add_argument("--lengths", default="128,512,4096", type=lambda t: [int(x) for x in t.split(",")])
    parser.add_argument("--requests", type=int, default=200, help="timed requests per length")
    parser.add_argument("--serve-args", default="", help="more `quiver serve` options")
    parser.add_argument("--startup-timeout-s", type=float, default=600.0)
    parser.add_argument("--json", default="", help="also write the segments here")
    args = parser.parse_args(argv)
    if args.quick:
        args.device, args.model, args.lengths, args.requests = "cpu", "", [32], 20
    if not args.device:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    result = run(args)
    if not result:
        print("no request's events were all found", file=sys.stderr)
        return 1
    print(markdown(result))
    if args.json:
        Path(args.json).write_text(json.dumps({str(n): rows for n, rows in result.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
