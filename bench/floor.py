"""The floor of Quiver's batch-1 path on this host, and how far above it Quiver runs.

In one run, sequential requests through:
  (a) raw pyzmq: a client DEALER -> a broker process (two ROUTERs, forwarding frames unopened) -> a worker
      process (DEALER) and back, with Quiver's own socket setup and message frames (a Chunk of token ids
      out, a Result of one float32 row back), polling blocking, spinning, and spinning with the I/O threads
      on the polling thread's CPU as Quiver's processes do (`pinned`, common/wakeups.py); and the worker handing each
      chunk to a second thread and back, through queue.Queue, queue.SimpleQueue (as the worker does) or an
      inproc PAIR;
  (b) a bare Starlette app on uvicorn, POSTing a body the size of a token-id request, answered with a
      body the size of a one-vector response;
  (c) Quiver itself (`quiver serve`), /v1/embeddings with token ids, minus the worker's own step time
      (the x-inference-time header): the path overhead;
  (c') the same ids through Text Embeddings Inference's /embed;
  (d) a text of as many tokens (real English, bench/corpus.py) instead of its ids, minus the step and minus
      the frontend's own tokenization of that text, timed alone in this process once per request
      interval (tokenization_alone): the path overhead of a text request.
Then prints the overhead against the floor, (a) blocking + (b), measured at each length's body size (the
ids' body; a text's body is a little smaller).
Times are µs, p50 / p99. For (c) it also prints each process's CPU time per request (every thread, from
/proc schedstat): on a shared machine, where wall times drift between runs, the steadier figure to
compare two builds by.

    python -m quiver.bench.floor [--quick] [--device cuda --model DIR --lengths 128,512,4096]
    python -m quiver.bench.floor --url http://127.0.0.1:8080 --server-pid PID --model DIR   # a running server
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterable

import numpy as np
import zmq

from quiver.bench.local_server import cpu_seconds, free_port, wait_http
from quiver.common.protocol import Chunk, Result, decode
from quiver.common.transport import make_socket, send_frames
from quiver.common.wakeups import SpinCore

MODES = ("blocking", "spin", "pinned")
# How the worker passes a chunk to its second thread, if at all: queue.Queue, queue.SimpleQueue (what the
# worker uses) or an inproc PAIR socket; the answers come back through an inproc PUSH as in the worker.
HANDOFFS = ("none", "queue", "simplequeue", "inproc")


def _poll(poller: zmq.Poller, spin: bool, core: SpinCore | None = None) -> dict[Any, int]:
    while True:
        events = dict(poller.poll(0 if spin else 100))
        if events:
            return events
        if core is not None:
            core.spin_turn()


def _spin_core(ctx: zmq.Context, mode: str) -> SpinCore | None:
    """In mode `pinned`, the context's I/O threads held on the caller's CPU; made before its first socket."""
    if mode != "pinned":
        return None
    core = SpinCore(ctx)
    core.hold()
    return core


def _broker(front: str, back: str, mode: str, ready: Any) -> None:
    """Forward client frames to the one worker and its answers back, never opening the body."""
    ctx = zmq.Context()
    core, spin = _spin_core(ctx, mode), mode != "blocking"
    clients, workers = make_socket(ctx, zmq.ROUTER), make_socket(ctx, zmq.ROUTER)
    clients.bind(front)
    workers.bind(back)
    worker_id = workers.recv_multipart()[0]  # the worker's hello
    ready.set()
    poller = zmq.Poller()
    poller.register(clients, zmq.POLLIN)
    poller.register(workers, zmq.POLLIN)
    while True:
        events = _poll(poller, spin, core)
        if clients in events:
            client_id, *frames = clients.recv_multipart(copy=False)
            send_frames(workers, [client_id, *frames], identity=worker_id)
        if workers in events:
            _, client_id, *frames = workers.recv_multipart(copy=False)
            send_frames(clients, frames, identity=client_id.bytes)


def _answer(frames: list[Any], dim: int) -> list[Any]:
    chunk = decode(frames)
    assert isinstance(chunk, Chunk)
    values = np.ones((chunk.num_seqs, dim), dtype=np.float32)
    return Result(chunk_id=chunk.chunk_id, num_seqs=chunk.num_seqs, dim=dim, queue_s=0.0, inference_s=0.0,
                  worker="floor", values=values).encode()


def _worker(back: str, mode: str, handoff: str, dim: int) -> None:
    """Answer every chunk; with a hand-off, a second thread does the answering, as the scheduler does."""
    ctx = zmq.Context()
    core, spin = _spin_core(ctx, mode), mode != "blocking"
    sock = make_socket(ctx, zmq.DEALER)
    sock.connect(back)
    sock.send(b"hello")
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    if handoff == "none":
        while True:
            _poll(poller, spin, core)
            client_id, *frames = sock.recv_multipart(copy=False)
            send_frames(sock, [client_id, *_answer(frames, dim)])
    outbox_pull = make_socket(ctx, zmq.PULL)
    outbox_pull.bind("inproc://floor-out")
    poller.register(outbox_pull, zmq.POLLIN)
    inbox: queue.Queue[list[Any]] | queue.SimpleQueue[list[Any]] = (
        queue.SimpleQueue() if handoff == "simplequeue" else queue.Queue())
    if handoff == "inproc":
        inbox_push = make_socket(ctx, zmq.PAIR)
        inbox_push.bind("inproc://floor-in")

    def scheduler() -> None:
        outbox = make_socket(ctx, zmq.PUSH)
        outbox.connect("inproc://floor-out")
        pair = None
        if handoff == "inproc":
            pair = make_socket(ctx, zmq.PAIR)
            pair.connect("inproc://floor-in")
        while True:
            frames = pair.recv_multipart(copy=False) if pair is not None else inbox.get()
            outbox.send_multipart([frames[0], *_answer(frames[1:], dim)], copy=False)

    threading.Thread(target=scheduler, daemon=True).start()
    while True:
        events = _poll(poller, spin, core)
        if sock in events:
            frames = sock.recv_multipart(copy=False)
            if handoff == "inproc":
                inbox_push.send_multipart(frames, copy=False)
            else:
                inbox.put(frames)
        if outbox_pull in events:
            send_frames(sock, outbox_pull.recv_multipart(copy=False))


def _spin_for(seconds: float, core: SpinCore | None) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        if core is not None:
            core.spin_turn()


def _percentiles(samples_s: list[float]) -> tuple[float, float]:
    values = np.asarray(samples_s) * 1e6
    return round(float(np.percentile(values, 50)), 1), round(float(np.percentile(values, 99)), 1)


def zmq_round_trip(mode: str, handoff: str, requests: int, tokens: int, dim: int,
                   gap_us: float = 0.0) -> tuple[float, float]:
    """p50 / p99 µs of client -> broker -> worker -> broker -> client, each in its own process; with
    `gap_us`, the client waits that long (spinning) before each request, as a stream does while the
    engine works, so every thread of the path has slept as long."""
    spin = mode != "blocking"
    tag = f"{os.getpid()}-{mode}-{handoff}-{gap_us:.0f}"
    front, back = f"ipc:///tmp/quiver-floor-{tag}-f", f"ipc:///tmp/quiver-floor-{tag}-b"
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    processes = [context.Process(target=_broker, args=(front, back, mode, ready), daemon=True),
                 context.Process(target=_worker, args=(back, mode, handoff, dim), daemon=True)]
    for process in processes:
        process.start()
    ctx = zmq.Context()
    core = _spin_core(ctx, mode)
    client = make_socket(ctx, zmq.DEALER)
    try:
        if not ready.wait(60):
            raise RuntimeError("the floor broker or worker did not start")
        client.connect(front)
        ids = np.arange(tokens, dtype=np.int32) % 1000 + 10
        poller = zmq.Poller()
        poller.register(client, zmq.POLLIN)
        samples = []
        for index in range(requests + requests // 5 + 5):
            chunk = Chunk(chunk_id=f"c{index}", task="embed", num_seqs=1, num_tokens=tokens, normalize=True,
                          timeout_s=30.0, input_ids=ids, seq_lens=np.array([tokens], dtype=np.int32))
            if gap_us:
                _spin_for(gap_us / 1e6, core)
            started = time.perf_counter()
            send_frames(client, chunk.encode())
            _poll(poller, spin, core)
            client.recv_multipart(copy=False)
            if index >= requests // 5 + 5:
                samples.append(time.perf_counter() - started)
        return _percentiles(samples)
    finally:
        if core is not None:
            core.release()
        client.close()
        ctx.term()
        for process in processes:
            process.kill()
            process.join(5)


STARLETTE_APP = """
import sys
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route
import uvicorn

answer = b'{"data":[{"embedding":[' + b",".join([b"0.0123456789"] * int(sys.argv[2])) + b']}]}'

async def echo(request):
    await request.body()
    return Response(answer, media_type="application/json")

uvicorn.run(Starlette(routes=[Route("/echo", echo, methods=["POST"])]), host="127.0.0.1",
            port=int(sys.argv[1]), log_level="warning")
"""


def _sent(requests: int) -> int:
    """Requests _post_times sends for `requests` timed ones: a fifth more, plus five, warm the path up."""
    return requests + requests // 5 + 5


def _post_times(port: int, path: str, body: bytes, requests: int) -> tuple[list[float], list[float]]:
    """Client seconds and the x-inference-time header (s, 0 when absent) of sequential POSTs."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    client, inference = [], []
    for index in range(_sent(requests)):
        started = time.perf_counter()
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
        elapsed = time.perf_counter() - started
        if response.status != 200:
            raise RuntimeError(f"{path} answered {response.status}")
        if index >= requests // 5 + 5:
            client.append(elapsed)
            inference.append(float(response.getheader("x-inference-time", "0")) / 1000)
    return client, inference


def tokenization_alone(model: str, text: str, requests: int, gap_s: float) -> dict[str, float]:
    """The frontend's own tokenization of `text`, as a request of it runs it (the server's truncation
    setting, special tokens added, checked into ragged ids), timed in this process: back to back ("warm"),
    and once every gap_s ("spaced", as requests come). Spaced, its tables are as cold again as a request
    finds them: on the development VM a 128-token text took 122 µs back to back and 305 µs at 20-ms gaps.
    µs, p50 / p99 of each."""
    from quiver.common.config import FrontendSettings
    from quiver.common.model_info import load_model_info
    from quiver.frontend.tokenization import TextTokenizer

    tokenizer = TextTokenizer(load_model_info(model), pool_threads=1)
    truncate = FrontendSettings().auto_truncate
    result: dict[str, float] = {}
    try:
        for name, gap in (("warm", 0.0), ("spaced", gap_s)):
            times = []
            for index in range(_sent(requests)):
                if gap:
                    time.sleep(gap)
                started = time.perf_counter()
                tokenizer.encode_sync([text], truncate, "right")
                if index >= requests // 5 + 5:
                    times.append(time.perf_counter() - started)
            result[f"{name}_p50"], result[f"{name}_p99"] = _percentiles(times)
    finally:
        tokenizer.close()
    return result


def _token_body(tokens: int, vocab: int, key: str = "input") -> bytes:
    """One input of `tokens` ids, as the OpenAI client sends them (`key` "inputs" for /embed)."""
    ids = [int(x) for x in np.random.default_rng(0).integers(10, vocab - 1, size=tokens)]
    return json.dumps({key: [ids]}).encode()


def starlette_round_trip(requests: int, tokens: int, dim: int) -> tuple[float, float]:
    port = free_port()
    process = subprocess.Popen([sys.executable, "-c", STARLETTE_APP, str(port), str(dim)])
    try:
        wait_http(port, "/echo", 60, process)
        client, _ = _post_times(port, "/echo", _token_body(tokens, 30000), requests)
        return _percentiles(client)
    finally:
        process.terminate()
        process.wait(10)


IDLE_SETTLE_S = 2.0  # after /health answers, let every process finish its start-up work


def _process_tree(pid: int) -> dict[int, str]:
    """pid -> command line of pid and all its descendants (Linux /proc)."""
    tree, pending = {}, [pid]
    while pending:
        current = pending.pop()
        try:
            tree[current] = open(f"/proc/{current}/cmdline", "rb").read().replace(b"\0", b" ").decode()[:80]
            for task in os.listdir(f"/proc/{current}/task"):
                pending += [int(c) for c in open(f"/proc/{current}/task/{task}/children").read().split()]
        except OSError:
            continue
    return tree


def idle_cpu(pid: int, seconds: float) -> dict[str, float]:
    """Share of one core each process of `quiver serve` burns while no request comes."""
    tree = _process_tree(pid)
    before = _cpu_now(tree)
    time.sleep(seconds)
    after = _cpu_now(before)
    return {f"{p} {tree[p]}": round((after[p] - before[p]) / seconds, 3) for p in after}


def _cpu_now(pids: Iterable[int]) -> dict[int, float]:
    """cpu_seconds of each process still running (a server's helper processes, such as the compiler's
    workers, may end while it is measured)."""
    seconds = {}
    for pid in pids:
        try:
            seconds[pid] = cpu_seconds(pid)
        except FileNotFoundError:
            continue
    return seconds


def _overhead_at(port: int, pid: int, args: argparse.Namespace, lengths: list[int], vocab: int,
                 texts: dict[int, str]) -> dict[str, Any]:
    out: dict[str, Any] = {"idle_cpu": idle_cpu(pid, args.idle_s) if pid else {}}
    tree = _process_tree(pid) if pid else {}
    for length in lengths:
        before = _cpu_now(tree)
        row = _route_overhead(port, "/v1/embeddings", _token_body(length, vocab), args.requests)
        after = _cpu_now(before)
        row["cpu_us_per_request"] = {f"{p} {tree[p]}": round((after[p] - before[p]) * 1e6 / _sent(args.requests), 1)
                                     for p in after}
        if args.tei:  # the same ids through Text Embeddings Inference's /embed
            row["tei"] = _route_overhead(port, "/embed", _token_body(length, vocab, key="inputs"), args.requests)
        if length in texts:
            row["text"] = _text_overhead(port, args, texts[length])
        out[str(length)] = row
    return out


def _route_overhead(port: int, path: str, body: bytes, requests: int,
                    tokenization: Callable[[float], dict[str, float]] | None = None) -> dict[str, Any]:
    """Client p50/p99 µs of sequential POSTs of `body` to `path`, and the overhead p50/p99 µs: the client's
    time less the worker's step (x-inference-time) and, given `tokenization` (called with the client's
    p50 in seconds, giving tokenization_alone's figures, kept as tokenize_*), less its spaced p50."""
    client, inference = _post_times(port, path, body, requests)
    client_p50, client_p99 = _percentiles(client)
    row: dict[str, Any] = {"client_p50": client_p50, "client_p99": client_p99}
    less_s = 0.0
    if tokenization is not None:
        alone = tokenization(client_p50 / 1e6)
        row.update({f"tokenize_{name}": value for name, value in alone.items()})
        less_s = alone["spaced_p50"] / 1e6
    row["overhead_p50"], row["overhead_p99"] = _percentiles([c - i - less_s for c, i in zip(client, inference)])
    return row


def _text_overhead(port: int, args: argparse.Namespace, text: str) -> dict[str, Any]:
    """A text request's figures (_route_overhead), its tokenization timed alone back to back and spaced by
    the request's p50 (tokenization_alone), the overhead beyond the step and the spaced tokenization."""
    return _route_overhead(port, "/v1/embeddings", json.dumps({"input": text}).encode(), args.requests,
                           lambda gap_s: tokenization_alone(args.model_dir, text, args.requests, gap_s))


def quiver_overhead(args: argparse.Namespace, lengths: list[int], vocab: int,
                    texts: dict[int, str]) -> dict[str, Any]:
    """Idle CPU of each process, then per length: client p50/p99 µs, the overhead (client -
    x-inference-time) p50/p99 µs and each process's CPU µs per request; for a length in `texts`, the same
    for that text (see _text_overhead). Against --url when given (CPU then of --server-pid's processes),
    else of a `quiver serve` started here."""
    if args.url:
        return _overhead_at(int(args.url.rsplit(":", 1)[1].strip("/")), args.server_pid, args, lengths, vocab,
                            texts)
    port = free_port()
    command = [sys.executable, "-m", "quiver", "serve", "--port", str(port), "--device", args.device]
    if args.model:
        command += ["--model", args.model]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(port, "/health", args.startup_timeout_s, process)
        time.sleep(IDLE_SETTLE_S)
        return _overhead_at(port, process.pid, args, lengths, vocab, texts)
    finally:
        process.terminate()
        process.wait(60)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from quiver.bench.corpus import TokenCorpus
    from quiver.common.model_info import default_model_dir, load_model_info

    args.model_dir = args.model or str(default_model_dir())
    info = load_model_info(args.model_dir)
    lengths = [n for n in args.lengths if n <= info.max_input_length]
    corpus = TokenCorpus(info.tokenizer_path) if args.texts else None
    texts = {length: corpus.text(length) for length in lengths} if corpus is not None else {}
    floor_tokens = lengths[0]
    rows: dict[str, tuple[float, float]] = {}
    for handoff in HANDOFFS:
        for mode in args.modes:
            rows[f"pyzmq client -> broker -> worker ({handoff} hand-off), {mode}"] = zmq_round_trip(
                mode, handoff, args.requests, floor_tokens, info.hidden_size)
    rows["Starlette on uvicorn, bare POST"] = starlette_round_trip(args.requests, floor_tokens, info.hidden_size)
    floor_p50 = rows["pyzmq client -> broker -> worker (none hand-off), blocking"][0] + \
        rows["Starlette on uvicorn, bare POST"][0]
    # Longer inputs carry larger bodies over both hops: their floor is measured at their own size.
    floors = {str(floor_tokens): round(floor_p50, 1)}
    for length in lengths[1:]:
        zmq_row = zmq_round_trip("blocking", "none", args.requests, length, info.hidden_size)
        http_row = starlette_round_trip(args.requests, length, info.hidden_size)
        rows[f"pyzmq client -> broker -> worker (none hand-off), blocking, {length} tokens"] = zmq_row
        rows[f"Starlette on uvicorn, bare POST, {length} tokens"] = http_row
        floors[str(length)] = round(zmq_row[0] + http_row[0], 1)
    quiver = quiver_overhead(args, lengths, info.vocab_size, texts)
    idle = quiver.pop("idle_cpu")
    return {"floor_rows": rows, "floor_p50": round(floor_p50, 1), "floor_p50_by_length": floors, "quiver": quiver,
            "idle_cpu": idle}


def _print_overhead(first_column: str, rows: dict[str, dict[str, Any]], floors: dict[str, float]) -> None:
    """One table of client and overhead figures per length, with the overhead over that length's floor."""
    print()
    print(f"| {first_column} | Quiver client p50 / p99 µs | overhead (client - x-inference-time) p50 / p99 µs | "
          "overhead / floor at this length |")
    print("| --- | --- | --- | --- |")
    for length, row in rows.items():
        print(f"| {length} | {row['client_p50']} / {row['client_p99']} | {row['overhead_p50']} / "
              f"{row['overhead_p99']} | {row['overhead_p50'] / floors[length]:.2f} |")


def print_table(result: dict[str, Any]) -> None:
    print("| path | p50 µs | p99 µs |")
    print("| --- | --- | --- |")
    for name, (p50, p99) in result["floor_rows"].items():
        print(f"| {name} | {p50} | {p99} |")
    for length, floor in result["floor_p50_by_length"].items():
        print(f"| floor at {length} tokens: pyzmq blocking (no hand-off) + Starlette | {floor} | |")
    floors = result["floor_p50_by_length"]
    _print_overhead("tokens", result["quiver"], floors)
    tei_rows = {length: row["tei"] for length, row in result["quiver"].items() if "tei" in row}
    if tei_rows:
        _print_overhead("tokens, ids on /embed", tei_rows, floors)
    text_rows = {length: row["text"] for length, row in result["quiver"].items() if "text" in row}
    if text_rows:
        print()
        print("| tokens, one text | Quiver client p50 / p99 µs | tokenization alone p50 µs, back to back / spaced "
              "as requests | overhead (client - x-inference-time - spaced tokenization) p50 / p99 µs | "
              "overhead / floor at this length |")
        print("| --- | --- | --- | --- | --- |")
        for length, row in text_rows.items():
            ratio = row["overhead_p50"] / floors[length]
            print(f"| {length} | {row['client_p50']} / {row['client_p99']} | {row['tokenize_warm_p50']} / "
                  f"{row['tokenize_spaced_p50']} | {row['overhead_p50']} / {row['overhead_p99']} | {ratio:.2f} |")
    print()
    print("| process of `quiver serve`, requests of N tokens | CPU µs per request (all its threads) |")
    print("| --- | --- |")
    for length, row in result["quiver"].items():
        for process, micros in row.get("cpu_us_per_request", {}).items():
            print(f"| {process}, N = {length} | {micros} |")
    print()
    print("| process of `quiver serve`, idle | CPU (cores) |")
    print("| --- | --- |")
    for process, cores in result["idle_cpu"].items():
        print(f"| {process} | {cores} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="CI size: 20 requests, 128 tokens, blocking polls only (spinning needs free cores), CPU")
    parser.add_argument("--modes", default=",".join(MODES), type=lambda t: tuple(t.split(",")),
                        help="pyzmq polling, comma-separated: blocking, spin, pinned (spinning, the I/O threads on "
                             "the poller's CPU)")
    parser.add_argument("--device", default="", help="device of `quiver serve` (default: cuda if visible, else cpu)")
    parser.add_argument("--model", default="", help="checkpoint to serve (default: the packaged all-MiniLM-L6-v2)")
    parser.add_argument("--lengths", default="128,512,4096", type=lambda t: [int(x) for x in t.split(",")])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--startup-timeout-s", type=float, default=420.0)
    parser.add_argument("--idle-s", type=float, default=3.0, help="seconds over which idle CPU is measured")
    parser.add_argument("--json", default="", help="also write the figures here")
    parser.add_argument("--url", default="", help="measure this running server (http://127.0.0.1:PORT, loopback) "
                        "instead of starting one; --model must name its checkpoint")
    parser.add_argument("--server-pid", type=int, default=0, help="with --url: the server's pid, for idle CPU")
    parser.add_argument("--no-tei", dest="tei", action="store_false",
                        help="/v1/embeddings only: not the same ids through /embed too")
    parser.add_argument("--no-texts", dest="texts", action="store_false",
                        help="token ids only: no text request of each length, nor its tokenization timed alone")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.lengths, args.modes, args.device = 20, [128], ("blocking",), args.device or "cpu"
    if not args.device:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    result = run(args)
    print_table(result)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
