"""Where a batch-1 request's time goes, hop by hop, through a real `quiver serve`.

Starts `quiver serve` with a tracer preloaded into each of its processes (a sitecustomize module on
PYTHONPATH, written to a temporary folder; nothing of it is in the served code): every protocol message
sent (stamped as the send begins) or received (stamped once it is in), and a few stage entries (the
frontend's body parse and answer encoding, the worker scheduler's intake, launch, step end and answer),
are logged with time.monotonic_ns, which on Linux is one clock for every process of the host. Then
sequential token-id requests (with --texts, texts of as many tokens) go to /v1/embeddings, and each
request's events are lined up into one timeline: p50 / p90 µs of every segment, per length, of the whole
request, and of the whole request less its step (the path around the engine).

With --detail the frontend's and the worker's calls on the path are stamped too (entry `>`, return `<`:
the prologue, parse, check and chunking of the request, the response's write; the worker's decode,
intake, planning, the engine step's halves and the answer), and each stamp's offset from the client's
start is listed, with when the client had the response's headers and its end: where inside a segment
the time goes.

    python -m quiver.bench.hop_trace --device cuda --model DIR --lengths 128,512,4096 --requests 200
    python -m quiver.bench.hop_trace --quick          # the packaged model on the CPU, a few requests
    python -m quiver.bench.hop_trace --device cuda --model DIR --lengths 128 --detail

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
    import functools, inspect, threading, time
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

    def _around(owner, name, label):
        """With --detail: stamp a method's entry (label>) and return (label<), a coroutine's as it runs;
        a method the tree does not have is skipped (the tool also traces older trees)."""
        original = owner.__dict__.get(name)
        if original is None:
            return
        function = original.__func__ if isinstance(original, staticmethod) else original

        if inspect.iscoroutinefunction(function):
            @functools.wraps(function)
            async def wrapper(*args, **kwargs):
                _log(f"{label}>")
                try:
                    return await function(*args, **kwargs)
                finally:
                    _log(f"{label}<")
        else:
            @functools.wraps(function)
            def wrapper(*args, **kwargs):
                _log(f"{label}>")
                try:
                    return function(*args, **kwargs)
                finally:
                    _log(f"{label}<")

        setattr(owner, name, staticmethod(wrapper) if isinstance(original, staticmethod) else wrapper)

    def _around_function(module, name, label):
        """_around for a module's function, as the module's own code calls it."""
        original = getattr(module, name)

        def wrapped(*args, **kwargs):
            _log(f"{label}>")
            try:
                return original(*args, **kwargs)
            finally:
                _log(f"{label}<")

        setattr(module, name, wrapped)

    if "worker" in sys.orig_argv and os.environ.get("HOPTRACE_DETAIL"):
        import quiver.worker.engine.engine as engine
        import quiver.worker.engine.graphs as graphs
        import quiver.worker.engine.lazy as lazy
        import quiver.worker.link as link

        _around_function(engine, "plan_shape", "D.plan_shape")
        _around_function(engine, "pack_batch", "D.pack_batch")
        for owner, name, label in ((engine.Engine, "step", "D.step"),
                                   (engine.Engine, "_check_shapes", "D.check_shapes"),
                                   (engine.Engine, "upload", "D.upload"),
                                   (graphs.GraphRunner, "run", "D.replay"),
                                   (lazy.HostSlots, "acquire", "D.acquire"),
                                   (lazy.LazyTensor, "release", "D.release"),
                                   (scheduler.Scheduler, "_scatter", "D.scatter"),
                                   (link.BrokerConnection, "read", "D.read"),
                                   (link.BrokerConnection, "keep_alive", "D.keep_alive"),
                                   (link.InlineLink, "_service", "D.service"),
                                   (scheduler.Scheduler, "_absorb", "D.absorb"),
                                   (scheduler.Scheduler, "_check", "D.check"),
                                   (scheduler.Scheduler, "next_batch", "D.next_batch"),
                                   (scheduler.Scheduler, "_assemble", "D.assemble"),
                                   (scheduler.Scheduler, "_close_flight", "D.close_flight")):
            _around(owner, name, label)

        def recv(sock, flags=transport._NOBLOCK):  # link's recv, with the decode stamped apart
            frames = transport.recv_frames(sock, flags)
            _log("D.decode>")
            try:
                return transport.decode(frames)
            finally:
                _log("D.decode<")

        link.recv = recv
    if "frontend" in sys.orig_argv:
        import quiver.frontend.http as http
        import quiver.frontend.routes_embed as routes_embed
        _on_entry(http, "parse_body", "F.parse")
        _on_entry(routes_embed, "openai_embeddings_body", "F.encode")
        if os.environ.get("HOPTRACE_DETAIL"):
            import quiver.frontend.broker_client as broker_client
            import quiver.frontend.connections as connections
            import quiver.frontend.pipeline as pipeline
            import quiver.frontend.service as service
            import quiver.frontend.tokenization as tokenization
            import starlette.responses as responses
            for owner, name, label in ((http.RouteApp, "__call__", "E.app"),
                                       (service.Service, "embed", "E.embed"),
                                       (tokenization.TextTokenizer, "check_ids", "E.check_ids"),
                                       (tokenization.TextTokenizer, "encode_sync", "E.encode_sync"),
                                       (pipeline.Pipeline, "_chunks", "E.chunks"),
                                       (broker_client.BrokerClient, "_send", "E.send"),
                                       (broker_client.BrokerClient, "_receive", "E.receive"),
                                       (broker_client.BrokerClient, "_on_message", "E.on_message"),
                                       (service.Service, "_observe", "E.observe"),
                                       (responses.Response, "__init__", "E.response"),
                                       (responses.Response, "__call__", "E.respond"),
                                       (connections.HeadHoldingTransport, "write", "E.write"),
                                       (connections.HeadHoldingTransport, "flush", "E.flush"),
                                       (connections.GuardedHttpToolsProtocol, "on_response_complete", "E.complete")):
                _around(owner, name, label)
            for name in ("parse_json", "parse", "json_response"):
                _around_function(http, name, f"E.{name}")
            routes_embed.json_response = http.json_response
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


def _events(trace_dir: Path) -> list[tuple[int, str, str, str]]:
    """Every logged event, (ns, pid, thread, what), in time order."""
    events = []
    for path in trace_dir.glob("*.log"):
        for line in path.read_text().splitlines():
            ns, pid, thread, what = line.split()
            events.append((int(ns), pid, thread, what))
    events.sort()
    return events


def timelines(trace_dir: Path, requests: list[tuple[int, int, int, int]]) -> dict[int, np.ndarray]:
    """Per length, an array [requests, len(ORDER)] of event times (ns); requests whose events are not all
    found (a heartbeat in the way, say) are left out."""
    events = _events(trace_dir)
    roles = _roles(events)
    # A worker whose broker socket has a thread of its own (worker/link.py) sends a result twice: the
    # scheduler's push into the outbox, then that thread's send to the broker; only the second counts.
    threaded = {pid for _, pid, thread, _ in events if thread == "broker-link"}
    times = np.array([event[0] for event in events], dtype=np.int64)
    out: dict[int, list[list[int]]] = collections.defaultdict(list)
    for started, ended, length, _ in requests:
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


def detail(trace_dir: Path, requests: list[tuple[int, int, int, int]]) -> dict[int, list[dict[str, Any]]]:
    """With --detail: per length, every stamp of the frontend (F) and the worker (W), as its offset from the
    client's start of the request, p50 / p90 µs over the requests (a stamp's second and third time in a
    request show as "#2", "#3"; a row's count of requests says how often it was met). Read the differences
    between neighbouring rows."""
    events = _events(trace_dir)
    roles = _roles(events)
    times = np.array([event[0] for event in events], dtype=np.int64)
    offsets: dict[int, dict[str, list[float]]] = collections.defaultdict(lambda: collections.defaultdict(list))
    for started, ended, length, headers_read in requests[WARMUP:]:
        seen: collections.Counter[str] = collections.Counter()
        offsets[length]["C headers read"].append((headers_read - started) / 1e3)
        offsets[length]["C end"].append((ended - started) / 1e3)
        for ns, pid, _, what in events[np.searchsorted(times, started):np.searchsorted(times, ended, "right")]:
            role = roles.get(pid)
            if role not in ("F", "W"):
                continue
            stamp = f"{role} {what}"
            seen[stamp] += 1
            if seen[stamp] <= 3:
                offsets[length][stamp if seen[stamp] == 1 else f"{stamp} #{seen[stamp]}"].append((ns - started) / 1e3)
    return {length: sorted(({"stamp": what, "p50_us": round(float(np.percentile(got, 50)), 1),
                             "p90_us": round(float(np.percentile(got, 90)), 1), "requests": len(got)}
                            for what, got in by_stamp.items()), key=lambda row: row["p50_us"])
            for length, by_stamp in offsets.items()}


def segments(rows: np.ndarray) -> list[dict[str, Any]]:
    table = []
    for i in range(1, len(ORDER)):
        gaps = (rows[:, i] - rows[:, i - 1]) / 1e3
        table.append({"from": ORDER[i - 1], "to": ORDER[i], "p50_us": round(float(np.percentile(gaps, 50)), 1),
                      "p90_us": round(float(np.percentile(gaps, 90)), 1)})
    total = (rows[:, -1] - rows[:, 0]) / 1e3
    table.append({"from": "C.start", "to": "C.end", "p50_us": round(float(np.percentile(total, 50)), 1),
                  "p90_us": round(float(np.percentile(total, 90)), 1)})
    # The path around the engine: each request's whole time less its step (what floor.py calls overhead).
    outside = total - (rows[:, ORDER.index("W.done")] - rows[:, ORDER.index("W.launch")]) / 1e3
    table.append({"from": "C.start", "to": "C.end", "label": "the whole request less W.launch → W.done",
                  "p50_us": round(float(np.percentile(outside, 50)), 1),
                  "p90_us": round(float(np.percentile(outside, 90)), 1)})
    return table


def _send_requests(port: int, lengths: list[int], count: int, vocab: int,
                   texts: dict[int, str] | None = None) -> list[tuple[int, int, int, int]]:
    """Each length's requests: token ids, or with `texts` that length's text (the same body every time)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    rng = np.random.default_rng(0)
    done = []
    for length in lengths:
        if texts is not None:
            body = json.dumps({"input": texts[length]}).encode()
        else:
            body = json.dumps({"input": [[int(x) for x in rng.integers(5, vocab - 1, size=length)]]}).encode()
        for _ in range(count + WARMUP):
            time.sleep(0.002)  # every process idle again, as between a user's requests
            started = time.monotonic_ns()
            connection.request("POST", "/v1/embeddings", body=body, headers={"Content-Type": "application/json"})
            response = connection.getresponse()
            headers_read = time.monotonic_ns()
            response.read()
            if response.status != 200:
                raise RuntimeError(f"/v1/embeddings answered {response.status} for {length} tokens")
            done.append((started, time.monotonic_ns(), length, headers_read))
    return done


def run(args: argparse.Namespace) -> tuple[dict[int, list[dict[str, Any]]], dict[int, list[dict[str, Any]]]]:
    """The segments per length, and with --detail the worker's stamps per length (else empty)."""
    from quiver.common.model_info import default_model_dir, load_model_info

    info = load_model_info(args.model or default_model_dir())
    lengths = [n for n in args.lengths if n <= info.max_input_length]
    texts = None
    if args.texts:
        from quiver.bench.corpus import TokenCorpus

        corpus = TokenCorpus(info.tokenizer_path)
        texts = {length: corpus.text(length) for length in lengths}
    with tempfile.TemporaryDirectory(prefix="quiver-hop-trace-") as folder:
        site, trace = Path(folder, "site"), Path(folder, "trace")
        site.mkdir()
        trace.mkdir()
        (site / "sitecustomize.py").write_text(TRACER)
        env = dict(os.environ, HOPTRACE=str(trace), HOPTRACE_DETAIL="1" if args.detail else "",
                   PYTHONPATH=os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])]))
        port = free_port()
        command = [sys.executable, "-m", "quiver", "serve", "--port", str(port), "--device", args.device,
                   *(["--model", args.model] if args.model else []), *args.serve_args.split()]
        server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_http(port, "/health", args.startup_timeout_s, server)
            requests = _send_requests(port, lengths, args.requests, info.vocab_size, texts)
        finally:
            server.terminate()
            server.wait(60)
        hops = {length: segments(rows) for length, rows in timelines(trace, requests).items() if len(rows)}
        return hops, detail(trace, requests) if args.detail else {}


def markdown(result: dict[int, list[dict[str, Any]]]) -> str:
    lengths = sorted(result)
    lines = ["| segment | " + " | ".join(f"{n} tokens, p50 / p90 µs" for n in lengths) + " |",
             "| --- |" + " --- |" * len(lengths)]
    for i, row in enumerate(result[lengths[0]]):
        cells = " | ".join(f"{result[n][i]['p50_us']} / {result[n][i]['p90_us']}" for n in lengths)
        lines.append(f"| {row.get('label') or row['from'] + ' → ' + row['to']} | {cells} |")
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
    parser.add_argument("--texts", action="store_true",
                        help="send a text of each length (real English, bench/corpus.py) instead of token ids")
    parser.add_argument("--detail", action="store_true",
                        help="also stamp the frontend's and the worker's calls on the path (see the module's docstring)")
    args = parser.parse_args(argv)
    if args.quick:
        args.device, args.model, args.lengths, args.requests = "cpu", "", [32], 20
    if not args.device:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    result, stamps_by_length = run(args)
    if not result:
        print("no request's events were all found", file=sys.stderr)
        return 1
    print(markdown(result))
    for length, stamps in sorted(stamps_by_length.items()):
        print(f"\n{length} tokens: each stamp's offset from the client's start, p50 / p90 µs")
        for row in stamps:
            print(f"  {row['stamp']:<20} {row['p50_us']:>8} / {row['p90_us']:<8} ({row['requests']} requests)")
    if args.json:
        out: dict[str, Any] = {str(n): rows for n, rows in result.items()}
        if stamps_by_length:
            out["detail"] = {str(n): rows for n, rows in stamps_by_length.items()}
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
