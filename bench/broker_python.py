"""The broker's own Python per chunk, without its sockets: what trimming the broker's code can gain.

Builds a real Broker (inproc endpoints), registers one stand-in worker, then feeds it pre-built frames
(zmq.Frame objects, as received) of CHUNKs from a frontend and their RESULTs from the worker, through
the broker's reading of them (broker/wire.py) and its handlers, with its sends captured instead of sent.
Prints µs per chunk (both directions), the fastest and the median of --rounds rounds.
`bench/broker_capacity.py` measures the whole broker process (ZeroMQ calls, poll loop, libzmq's I/O
thread); this is the Python part alone.

    python -m quiver.bench.broker_python [--chunks 2000] [--rounds 15] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time
from typing import Any

import numpy as np
import zmq

import quiver.broker.broker as broker_module
from quiver.bench.stand_in_peers import small_chunk, stand_in_ready, stand_in_result
from quiver.common.config import BrokerSettings
from quiver.broker.wire import read
from quiver.common.protocol import peek

WORKER_IDENTITY = b"w" * 32
FRONTEND_IDENTITY = b"f" * 16


def measure(chunks: int, rounds: int, profile: bool = False) -> dict[str, Any]:
    sent: list[Any] = []
    real_sends = broker_module.send_frames, broker_module.send
    broker_module.send_frames = lambda sock, frames, identity=None, flags=0: sent.append(frames)  # type: ignore[assignment]
    broker_module.send = lambda sock, message, identity=None: sent.append(message.encode())  # type: ignore[assignment]
    ctx = zmq.Context()
    broker = broker_module.Broker(BrokerSettings(frontend_endpoint="inproc://frontends",
                                                 worker_endpoint="inproc://workers"), ctx)
    try:
        broker._on_worker_message(WORKER_IDENTITY, peek(stand_in_ready("stand-in-0", 384).encode()))
        rng = np.random.default_rng(0)
        made = [small_chunk(4, 16, rng) for _ in range(chunks)]
        inbound = [[zmq.Frame(FRONTEND_IDENTITY), *(zmq.Frame(bytes(memoryview(f))) for f in chunk.encode())]
                   for chunk in made]
        outbound = [[zmq.Frame(WORKER_IDENTITY),
                     *(zmq.Frame(bytes(memoryview(f))) for f in stand_in_result(chunk, "stand-in-0", 384).encode())]
                    for chunk in made]

        def one_round() -> float:
            started = time.perf_counter()
            for chunk_frames, result_frames in zip(inbound, outbound):
                broker._on_frontend_message(*read(chunk_frames))
                broker._on_worker_message(*read(result_frames))
            return (time.perf_counter() - started) / chunks * 1e6

        one_round()
        sent.clear()
        times = sorted(one_round() for _ in range(rounds))
        answered = len(sent)
        if profile:
            profiler = cProfile.Profile()
            profiler.enable()
            one_round()
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    finally:
        broker.close()
        ctx.term()
        broker_module.send_frames, broker_module.send = real_sends
    return {"chunks": chunks, "rounds": rounds, "fastest_us": round(times[0], 1),
            "median_us": round(statistics.median(times), 1), "messages_sent": answered}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of one more round")
    args = parser.parse_args(argv)
    result = measure(args.chunks, args.rounds, args.profile)
    print(f"broker Python per chunk, both directions: fastest {result['fastest_us']} µs, median "
          f"{result['median_us']} µs ({result['chunks']} chunks × {result['rounds']} rounds; "
          f"{result['messages_sent']} messages sent)")
    return 0 if result["messages_sent"] == 2 * args.chunks * args.rounds else 1


if __name__ == "__main__":
    raise SystemExit(main())
