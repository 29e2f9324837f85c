"""Closed-loop clients against the worker's real step planner, with the GPU and the frontend modelled: a
scheduling policy's latencies at load, on any machine, in seconds.

Each client sends one text of --tokens tokens, waits for its answer and sends the next (as `quiver
bench`'s concurrency benchmark does). A request crosses a hop (--hop-ms, plus an exponential tail of mean
--hop-tail-ms standing for the host's noise), is parsed on the frontend's event loop, tokenized on one of
--tokenizer-threads pool threads, chunked and sent on the loop, crosses a hop to the worker, waits there
for the planner (worker/planner.py, the code the worker runs) to put it in a step, and comes back over a
hop to the loop, which writes the answer. An event loop does one piece of work at a time, in the order
the pieces become ready; with --frontend-processes N, client i's connection is served by loop i mod N.

The worker launches steps as scheduler.py does: when the device is idle, everything waiting (up to the
budgets); while a step runs, a step that no later arrival could join is queued behind it on each arrival
(one at most; --queue-steps off turns this off). A step takes --step-ms + --step-us-per-token per token,
times a uniform jitter of ±--step-jitter; one launched on an idle device starts after the worker's host
work (--launch-ms: pack, copy, launch), while a queued one starts as the step before ends, its host work
done meanwhile.

The defaults are fitted to the pplx-embed-0.6B shape on one H100 (bench/RESULTS.md, 2026-12-06, last): a
step of 8 × 512 tokens in ~9 ms (888 requests/s at 64 clients), a lone 512-token step in ~1.8 ms with its
launch (the worker's own measure), ~2.5 ms of path around it. What it leaves out: CPU contention between
the processes, the worker's own CPU time beyond the step, garbage collection. Compare policies with one
another here, and measure the one you pick on the GPU.

    python -m quiver.bench.sched_sim                                    # the defaults, 1 to 64 clients
    python -m quiver.bench.sched_sim --shared-step-tokens 4096,2048 --queue-steps on,off --clients 8,16
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from quiver.common.protocol import Chunk
from quiver.worker.planner import StepPlanner
from quiver.worker.steps import ChunkJob


@dataclass
class Model:
    """The modelled path and device (seconds), and the policy under test."""

    tokens: int = 512
    step_s: float = 0.45e-3
    step_s_per_token: float = 2.09e-6
    step_jitter: float = 0.1
    launch_s: float = 0.3e-3  # the worker's host work before a step on an idle device starts (a queued one's is done)
    hop_s: float = 0.25e-3
    hop_tail_s: float = 0.3e-3
    parse_s: float = 0.15e-3
    send_s: float = 0.15e-3
    answer_s: float = 0.3e-3
    tokenize_s: float = 0.7e-3
    tokenizer_threads: int = 4  # a frontend process's tokenization pool
    frontend_processes: int = 1
    cpu_jitter: float = 0.2
    max_batch_tokens: int = 16384
    max_batch_seqs: int = 256
    shared_step_tokens: int = 4096
    queue_steps: bool = True


@dataclass
class Outcome:
    latencies_ms: list[float] = field(default_factory=list)
    step_sizes: list[int] = field(default_factory=list)


def simulate(model: Model, clients: int, requests: int, seed: int = 0) -> Outcome:
    """Every request's latency (the first five per client left out, as a warm-up) and every step's size."""
    rng = random.Random(seed)
    clock = 0.0
    planner = StepPlanner(model.max_batch_tokens, model.max_batch_seqs, "cuda", expire=lambda job: None,
                          shared_step_tokens=model.shared_step_tokens, clock=lambda: clock)
    events: list[tuple[float, int, str, Any]] = []
    order = itertools.count()
    outcome = Outcome()
    loop_free = [0.0] * model.frontend_processes  # when each process's event loop is next free
    pool_free = [[0.0] * model.tokenizer_threads for _ in range(model.frontend_processes)]
    running: list[tuple[float, list[int]]] = []  # the running step, then the one queued behind it
    sent: dict[int, tuple[int, float]] = {}  # request -> (client, when it was sent)
    answered = 0
    ids = np.arange(1, model.tokens + 1, dtype=np.int32)
    loop_cost = {"parse": model.parse_s, "send": model.send_s, "answer": model.answer_s}

    def push(when: float, kind: str, payload: Any = None) -> None:
        heapq.heappush(events, (when, next(order), kind, payload))

    def hop() -> float:
        return model.hop_s + (rng.expovariate(1 / model.hop_tail_s) if model.hop_tail_s > 0 else 0.0)

    def jittered(seconds: float, jitter: float) -> float:
        return seconds * rng.uniform(1 - jitter, 1 + jitter)

    def send(client: int, now: float) -> None:
        request = next(order)
        sent[request] = (client, now)
        push(now + hop(), "loop", ("parse", request))

    def launch(now: float) -> None:
        if len(running) >= (2 if model.queue_steps else 1):
            return
        picked = planner.next_batch(closed_only=bool(running))
        if picked is None:
            return
        batch, refs = picked
        start = running[-1][0] if running else now + model.launch_s
        end = start + jittered(model.step_s + model.step_s_per_token * batch.num_tokens, model.step_jitter)
        running.append((end, [int(ref.job.chunk.chunk_id) for ref in refs]))
        outcome.step_sizes.append(len(refs))
        push(end, "step done")

    for client in range(clients):
        send(client, rng.uniform(0, 2e-3))
    while events:
        clock, _, kind, payload = heapq.heappop(events)
        if kind == "loop":
            stage, request = payload
            process = sent[request][0] % model.frontend_processes
            free = loop_free[process] = max(clock, loop_free[process]) + jittered(loop_cost[stage], model.cpu_jitter)
            if stage == "parse":
                pool = pool_free[process]
                thread = min(range(model.tokenizer_threads), key=pool.__getitem__)
                pool[thread] = max(free, pool[thread]) + jittered(model.tokenize_s, model.cpu_jitter)
                push(pool[thread], "loop", ("send", request))
            elif stage == "send":
                push(free + hop(), "arrive", request)
            else:
                client, began = sent.pop(request)
                done = free + hop()
                outcome.latencies_ms.append((done - began) * 1e3)
                answered += 1
                if answered + len(sent) < clients * requests:
                    push(done, "send", client)
        elif kind == "send":
            send(payload, clock)
        elif kind == "arrive":
            chunk = Chunk(chunk_id=str(payload), task="embed", num_seqs=1, num_tokens=model.tokens, normalize=True,
                          timeout_s=60.0, input_ids=ids, seq_lens=np.array([model.tokens], dtype=np.int32))
            planner.add(ChunkJob(chunk=chunk, received=clock, deadline=clock + 60.0, rows_left=1), clock)
            launch(clock)
        else:  # a step is done: its answers go back, and the next step is launched
            _, requests_done = running.pop(0)
            for request in requests_done:
                push(clock + hop(), "loop", ("answer", request))
            launch(clock)
    outcome.latencies_ms = outcome.latencies_ms[5 * clients:]
    return outcome


def summary(model: Model, clients: int, requests: int, seeds: int) -> dict[str, float]:
    """p50 / p99 ms, their ratio and the mean step size, each the mean over `seeds` runs."""
    runs = [simulate(model, clients, requests, seed) for seed in range(seeds)]
    p50 = float(np.mean([np.percentile(run.latencies_ms, 50) for run in runs]))
    p99 = float(np.mean([np.percentile(run.latencies_ms, 99) for run in runs]))
    steps = float(np.mean([np.mean(run.step_sizes) for run in runs]))
    return {"p50": round(p50, 2), "p99": round(p99, 2), "ratio": round(p99 / p50, 2), "requests_per_step": round(steps, 1)}


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = Model()
    parser.add_argument("--clients", type=_ints, default=[1, 4, 8, 16, 64])
    parser.add_argument("--requests", type=int, default=300, help="requests per client")
    parser.add_argument("--seeds", type=int, default=3, help="runs per row, averaged")
    parser.add_argument("--tokens", type=int, default=defaults.tokens)
    parser.add_argument("--step-ms", type=float, default=defaults.step_s * 1e3)
    parser.add_argument("--step-us-per-token", type=float, default=defaults.step_s_per_token * 1e6)
    parser.add_argument("--step-jitter", type=float, default=defaults.step_jitter)
    parser.add_argument("--launch-ms", type=float, default=defaults.launch_s * 1e3)
    parser.add_argument("--hop-ms", type=float, default=defaults.hop_s * 1e3)
    parser.add_argument("--hop-tail-ms", type=float, default=defaults.hop_tail_s * 1e3)
    parser.add_argument("--tokenize-ms", type=float, default=defaults.tokenize_s * 1e3)
    parser.add_argument("--tokenizer-threads", type=int, default=defaults.tokenizer_threads)
    parser.add_argument("--frontend-processes", type=_ints, default=[defaults.frontend_processes])
    parser.add_argument("--shared-step-tokens", type=_ints, default=[defaults.shared_step_tokens])
    parser.add_argument("--queue-steps", default="on", help="on, off or on,off")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    rows = []
    print("| frontend processes | shared step tokens | queued steps | "
          + " | ".join(f"{n} clients" for n in args.clients) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in args.clients) + " |")
    for processes, shared, queued in itertools.product(args.frontend_processes, args.shared_step_tokens,
                                                       args.queue_steps.split(",")):
        model = Model(tokens=args.tokens, step_s=args.step_ms / 1e3, step_s_per_token=args.step_us_per_token / 1e6,
                      step_jitter=args.step_jitter, launch_s=args.launch_ms / 1e3, hop_s=args.hop_ms / 1e3,
                      hop_tail_s=args.hop_tail_ms / 1e3,
                      tokenize_s=args.tokenize_ms / 1e3, tokenizer_threads=args.tokenizer_threads,
                      frontend_processes=processes, shared_step_tokens=shared, queue_steps=queued == "on")
        cells = []
        for clients in args.clients:
            row = summary(model, clients, args.requests, args.seeds)
            rows.append({"frontend_processes": processes, "shared_step_tokens": shared, "queue_steps": queued,
                         "clients": clients, **row})
            cells.append(f"{row['p50']} / {row['p99']} (×{row['ratio']}), {row['requests_per_step']} a step")
        print(f"| {processes} | {shared} | {queued} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
