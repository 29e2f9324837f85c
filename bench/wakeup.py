"""How long a sleeping thread takes to wake on this host, and what keeps Quiver's hops off that cost.

Every ZeroMQ hop of a request wakes two libzmq I/O threads (the sender's, which writes the socket, and the
receiver's, which reads it), whatever the polling threads do. On a virtual machine a CPU with nothing to
run halts, and a thread woken there waits for the hypervisor to run that CPU again; the kernel places a
woken thread on an idle CPU when it can, so a busy-polling peer does not help. A request that comes after
the engine's milliseconds finds every I/O thread asleep. This measures, in one run:

  pipe  a one-byte ping-pong between two processes, the answering one asleep in read(), the asking one
        spinning for GAP µs before each ping: round trip p50 / p99 µs per gap, with the answering process
        free to run anywhere, or pinned to a CPU that a spinning process keeps awake (`keeper`: SCHED_IDLE,
        which a waking thread always preempts).
  zmq   the floor's client -> broker -> worker -> broker -> client round trip (bench/floor.py's frames),
        every process spinning, GAP µs between requests: libzmq's I/O threads left where the kernel puts
        them (`free`), or kept on the polling thread's own CPU (`pinned`, common/wakeups.py), the thread
        yielding at every turn of its spin; each gap runs on processes of its own.

    python -m quiver.bench.wakeup [--gaps-us 0,300,1500,5000] [--requests 300] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from typing import Any

import numpy as np

from quiver.bench.floor import zmq_round_trip


def _percentiles(samples_s: list[float]) -> list[float]:
    values = np.asarray(samples_s) * 1e6
    return [round(float(np.percentile(values, 50)), 1), round(float(np.percentile(values, 99)), 1)]


def _spin_until(deadline: float) -> None:
    while time.perf_counter() < deadline:
        pass


def _answer_pings(fd_in: int, fd_out: int, cpu: int | None) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    while (byte := os.read(fd_in, 1)) != b"q":
        os.write(fd_out, byte)


def _keep_awake(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    while True:
        pass


def pipe_round_trips(mode: str, gaps_us: list[int], requests: int, cpus: list[int]) -> dict[str, list[float]]:
    """p50 / p99 µs of a ping answered by a process asleep in read(), per idle gap before the ping."""
    context = multiprocessing.get_context("fork")  # the children keep the pipes' ends
    ping_r, ping_w = os.pipe()
    pong_r, pong_w = os.pipe()
    os.set_blocking(pong_r, False)
    answer_cpu = cpus[1] if mode != "free" else None
    processes = [context.Process(target=_answer_pings, args=(ping_r, pong_w, answer_cpu), daemon=True)]
    if mode == "keeper":
        processes.append(context.Process(target=_keep_awake, args=(cpus[1],), daemon=True))
    for process in processes:
        process.start()
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpus[0]})
    try:
        out = {}
        for gap in gaps_us:
            samples = []
            for index in range(requests + 20):
                _spin_until(time.perf_counter() + gap / 1e6)
                started = time.perf_counter()
                os.write(ping_w, b"p")
                while True:
                    try:
                        os.read(pong_r, 1)
                        break
                    except BlockingIOError:
                        continue
                if index >= 20:
                    samples.append(time.perf_counter() - started)
            out[str(gap)] = _percentiles(samples)
        os.write(ping_w, b"q")
        return out
    finally:
        os.sched_setaffinity(0, allowed)
        for process in processes:
            process.kill()
            process.join(5)
        for fd in (ping_r, ping_w, pong_r, pong_w):
            os.close(fd)


def zmq_round_trips(mode: str, gaps_us: list[int], requests: int) -> dict[str, list[float]]:
    """p50 / p99 µs of the floor's spinning round trip (bench/floor.py), free or pinned, per idle gap."""
    return {str(gap): list(zmq_round_trip("pinned" if mode == "pinned" else "spin", "none", requests, 128, 1024,
                                           gap_us=gap)) for gap in gaps_us}


def idle_settings() -> dict[str, str]:
    """The kernel's CPU idle settings, read only (what decides how deep an idle CPU sleeps)."""
    out = {}
    for path in ("/sys/devices/system/cpu/cpuidle/current_driver", "/sys/devices/system/cpu/cpuidle/current_governor",
                 "/sys/devices/system/cpu/cpuidle/current_governor_ro", "/sys/module/haltpoll/parameters/guest_halt_poll_ns",
                 "/proc/cmdline"):
        try:
            with open(path) as handle:
                out[path] = handle.read().strip()
        except OSError as exc:
            out[path] = f"({exc.strerror})"
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gaps-us", default="0,300,1500,5000", type=lambda t: [int(x) for x in t.split(",")])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--cpus", default="", type=lambda t: [int(x) for x in t.split(",") if x],
                        help="two CPUs for the pipe runs: the asking process's, the answering one's (default: the "
                             "last two this process may use)")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    cpus = args.cpus or sorted(os.sched_getaffinity(0))[-2:]
    if len(cpus) < 2:
        print("wakeup: needs two CPUs", file=sys.stderr)
        return 2
    result: dict[str, Any] = {"idle_settings": idle_settings(), "cpus": cpus}
    for mode in ("free", "keeper"):
        result[f"pipe {mode}"] = pipe_round_trips(mode, args.gaps_us, args.requests, cpus)
    for mode in ("free", "pinned"):
        result[f"zmq {mode}"] = zmq_round_trips(mode, args.gaps_us, args.requests)
    for path, value in result["idle_settings"].items():
        print(f"{path}: {value}")
    print()
    print("| path | " + " | ".join(f"gap {gap} µs: p50 / p99" for gap in args.gaps_us) + " |")
    print("| --- |" + " --- |" * len(args.gaps_us))
    for name, rows in result.items():
        if name.startswith(("pipe", "zmq")):
            print(f"| {name} | " + " | ".join(f"{p50} / {p99}" for p50, p99 in rows.values()) + " |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
