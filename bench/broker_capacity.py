"""The broker's capacity: chunks/s it routes and the time each hop through it takes, as workers grow.

Starts the real broker (`python -m quiver broker`) on loopback, stand-in workers that answer every
chunk at once and stand-in frontends that keep a window of small chunks in flight
(quiver.bench.stand_in_peers), for each worker count in turn. Per run it reports chunks/s, the
one-way time of each hop (frontend → worker, worker → frontend, through the broker) and the round
trip at p50/p99, and the broker's own CPU time per chunk (from /proc), which says what one core of
it can route whatever the other processes on the host take: chunks/s per broker core is the chunks
routed over the broker's CPU seconds, the rate one core would sustain were the broker the bottleneck.
A first row with no broker (a stand-in frontend talking straight to a stand-in worker) is the floor
of a ZeroMQ hop on the same host.

Each worker count runs twice: under load (window chunks in flight per frontend: capacity) and light
(one in flight per frontend: the latency the broker adds when it is not the bottleneck).

    python -m quiver.bench.broker_capacity --workers 1,2,4,8,16,64 --frontends 2 --seconds 5 --out DIR
    python -m quiver.bench.broker_capacity --quick --out DIR      # a few seconds, for CI
    python -m quiver.bench.broker_capacity --broker-tree /tmp/before  # the broker of another checkout

With --saturate, the peers instead send and answer pre-encoded frames (bench/saturating_peers.py), cheap
enough that the broker, pinned with its I/O thread to one CPU (the peers on the others), is the
bottleneck: its core share near 1.0 says so, and chunks/s is then what one core of it routes. Each worker
count runs the floor router (saturating_peers.forward_floor: the same sockets and ZeroMQ calls, nothing
else) on the same CPU in the same run; floor per core over broker per core is the broker's own cost.

    python -m quiver.bench.broker_capacity --saturate --workers 1,8,64 --transport ipc --seconds 5
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from quiver.bench.local_server import cpu_seconds, free_port
from quiver.bench.saturating_peers import (
    SaturatingRun, drive_saturating_frontend, forward_floor, serve_saturating_workers,
)
from quiver.bench.stand_in_peers import FrontendRun, drive_stand_in_frontend, serve_stand_in_workers
from quiver.common.security import CurveClient, make_keys


def free_endpoint(transport: str = "tcp", folder: Path | None = None) -> str:
    """A loopback TCP endpoint on a free port, or (transport "ipc") a new Unix socket path in `folder`, which
    the caller removes: `quiver serve`'s own broker endpoints on one host are ipc://; TCP is what workers on
    other hosts reach."""
    if transport == "ipc":
        if folder is None:
            raise ValueError("an ipc:// endpoint needs a folder for its socket")
        return f"ipc://{tempfile.mkdtemp(prefix='ipc-', dir=folder)}/broker.sock"
    return f"tcp://127.0.0.1:{free_port()}"


def start_broker(frontend_endpoint: str, worker_endpoint: str, extra: list[str], log_path: Path,
                 tree: str = "", cpus: set[int] | None = None) -> subprocess.Popen:
    """`quiver broker` on the two endpoints; with `tree`, imported from that source tree instead (run there,
    so that `-m` finds its `quiver` first); with `cpus`, it and its threads run on those CPUs only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUIVER_")}
    if tree:
        env["PYTHONPATH"] = str(Path(tree).resolve())
    with open(log_path, "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "quiver", "broker", "--frontend-endpoint", frontend_endpoint,
                                 "--worker-endpoint", worker_endpoint, "--log-level", "warning", *extra],
                                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tree or None,
                                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)


def curve_keys(directory: Path) -> tuple[list[str], CurveClient, CurveClient]:
    """Key pairs for a broker, the stand-in frontends and workers: the broker's options, and each side's keys.
    The broker's key options are spelled here only."""
    broker_public, broker_secret = make_keys(directory, "broker")
    broker_args = ["--curve-secret-key", str(broker_secret)]
    clients = []
    for role in ("frontend", "worker"):
        public, secret = make_keys(directory / role, role)
        admitted = directory / f"authorized-{role}s"
        admitted.mkdir()
        shutil.copy(public, admitted / public.name)
        clients.append(CurveClient(str(secret), str(broker_public)))
        broker_args += [f"--curve-{role}-keys-dir", str(admitted)]
    return broker_args, clients[0], clients[1]


def percentile_us(samples_ns: np.ndarray) -> dict[str, float]:
    if samples_ns.size == 0:
        return {"p50": float("nan"), "p99": float("nan")}
    return {"p50": round(float(np.percentile(samples_ns, 50)) / 1e3, 1),
            "p99": round(float(np.percentile(samples_ns, 99)) / 1e3, 1)}


def _collect(reports: Any, count: int, timeout_s: float, what: str) -> list[Any]:
    out: list[Any] = []
    end = time.monotonic() + timeout_s
    while len(out) < count:
        try:
            out.append(reports.get(timeout=max(0.1, end - time.monotonic())))
        except queue.Empty as exc:
            raise RuntimeError(f"{len(out)} of {count} {what} reported within {timeout_s:.0f} s") from exc
    return out


def run_once(workers: int, frontends: int, window: int, seconds: float, args: argparse.Namespace,
             log_path: Path) -> dict[str, Any]:
    """One measurement: a fresh broker (none when workers is 0), stand-in workers and frontends."""
    with tempfile.TemporaryDirectory(prefix="quiver-bench-") as scratch:
        return _run_in(Path(scratch), workers, frontends, window, seconds, args, log_path)


def _run_in(scratch: Path, workers: int, frontends: int, window: int, seconds: float, args: argparse.Namespace,
            log_path: Path) -> dict[str, Any]:
    """run_once with its socket paths and keys in `scratch`."""
    mp = multiprocessing.get_context("spawn")
    stop, go = mp.Event(), mp.Event()
    worker_reports, frontend_reports, ready = mp.Queue(), mp.Queue(), mp.Queue()
    frontend_endpoint, worker_endpoint = free_endpoint(args.transport, scratch), free_endpoint(args.transport, scratch)
    broker = None
    frontend_curve = worker_curve = None
    if workers:
        broker_args = args.broker_args.split()
        if args.curve:
            curve_args, frontend_curve, worker_curve = curve_keys(scratch / "keys")
            broker_args += curve_args
        broker = start_broker(frontend_endpoint, worker_endpoint, broker_args, log_path, args.broker_tree)
        names = [f"stand-in-{i}" for i in range(workers)]
        groups = [names[i::args.worker_processes] for i in range(min(args.worker_processes, workers))]
        worker_procs = [mp.Process(target=serve_stand_in_workers, daemon=True,
                                   args=(worker_endpoint, group, args.dim, 1.0, stop, worker_reports, "", worker_curve))
                        for group in groups]
    else:
        worker_procs = [mp.Process(target=serve_stand_in_workers, daemon=True,
                                   args=(worker_endpoint, [], args.dim, 1.0, stop, worker_reports, frontend_endpoint))]
    frontend_procs = [mp.Process(target=drive_stand_in_frontend, daemon=True,
                                 args=(frontend_endpoint, i, workers, window, seconds, args.seqs, args.tokens,
                                       args.dim, ready, go, frontend_reports, frontend_curve)) for i in range(frontends)]
    try:
        for proc in (*worker_procs, *frontend_procs):
            proc.start()
        _collect(ready, frontends, 120.0, "frontends ready")
        broker_cpu = cpu_seconds(broker.pid) if broker else 0.0
        go.set()
        runs: list[FrontendRun] = _collect(frontend_reports, frontends, seconds + 90.0, "frontends")
        if broker:
            broker_cpu = cpu_seconds(broker.pid) - broker_cpu
        stop.set()
        served = _collect(worker_reports, len(worker_procs), 30.0, "stand-in worker processes")
    finally:
        stop.set()
        if broker:
            broker.terminate()
            broker.wait(10)
        for proc in (*worker_procs, *frontend_procs):
            proc.join(5)
            if proc.is_alive():
                proc.kill()
    return summarize(workers, frontends, window, runs, served, broker_cpu)


def router_and_peer_cpus() -> tuple[set[int] | None, set[int] | None]:
    """One CPU for the router under test (its I/O thread included), the rest for the peers; no pinning on
    a host of one CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, None
    return {cpus[0]}, set(cpus[1:])


def run_saturated(router: str, workers: int, frontends: int, window: int, seconds: float, args: argparse.Namespace,
                  log_path: Path) -> dict[str, Any]:
    """One run of the saturating peers through `router` ("broker", or "floor": saturating_peers.forward_floor),
    the router alone on one CPU."""
    with tempfile.TemporaryDirectory(prefix="quiver-bench-") as scratch:
        mp = multiprocessing.get_context("spawn")
        stop, go = mp.Event(), mp.Event()
        worker_reports, frontend_reports, ready = mp.Queue(), mp.Queue(), mp.Queue()
        frontend_endpoint = free_endpoint(args.transport, Path(scratch))
        worker_endpoint = free_endpoint(args.transport, Path(scratch))
        router_cpus, peer_cpus = router_and_peer_cpus()
        if router == "broker":
            process = start_broker(frontend_endpoint, worker_endpoint, args.broker_args.split(), log_path,
                                   args.broker_tree, router_cpus)
        else:
            process = mp.Process(target=forward_floor, daemon=True,
                                 args=(frontend_endpoint, worker_endpoint, stop, router_cpus))
            process.start()
        names = [f"saturating-{i}" for i in range(workers)]
        peers = [mp.Process(target=serve_saturating_workers, daemon=True,
                            args=(worker_endpoint, names[i::args.worker_processes], args.seqs, args.tokens, args.dim,
                                  stop, worker_reports, peer_cpus))
                 for i in range(min(args.worker_processes, workers))]
        drivers = [mp.Process(target=drive_saturating_frontend, daemon=True,
                              args=(frontend_endpoint, i, window, seconds, args.seqs, args.tokens, args.dim, ready,
                                    go, frontend_reports, peer_cpus, None, args.rate / frontends))
                   for i in range(frontends)]
        try:
            for proc in (*peers, *drivers):
                proc.start()
            _collect(ready, frontends, 120.0, "saturating frontends ready")
            cpu_before, started = cpu_seconds(process.pid), time.monotonic()
            go.set()
            runs: list[SaturatingRun] = _collect(frontend_reports, frontends, seconds + 60.0, "saturating frontends")
            router_cpu, wall_s = cpu_seconds(process.pid) - cpu_before, time.monotonic() - started
            stop.set()
            answered = sum(_collect(worker_reports, len(peers), 30.0, "saturating worker processes"))
        finally:
            stop.set()
            if isinstance(process, subprocess.Popen):
                process.terminate()
                process.wait(10)
            else:
                process.join(5)
            for proc in (*peers, *drivers):
                proc.join(5)
                if proc.is_alive():
                    proc.kill()
    round_trips = np.concatenate([np.asarray(run.round_trips_ns, dtype=np.int64) for run in runs])
    chunks = int(round_trips.size)
    return {
        "router": router, "workers": workers, "frontends": frontends, "window": window, "rate": args.rate,
        "chunks": chunks,
        "chunks_per_s": round(chunks / wall_s) if wall_s else 0, "round_trip_us": percentile_us(round_trips),
        "router_core_share": round(router_cpu / wall_s, 2) if wall_s else None,
        "one_core_chunks_per_s": round(chunks / router_cpu) if router_cpu else None,
        "router_cpu_us_per_chunk": round(router_cpu / chunks * 1e6, 1) if chunks else None,
        "pinned": router_cpus is not None, "answered_by_workers": answered,
        "wrong_answers": sum(run.wrong_answers for run in runs), "unanswered": sum(run.unanswered for run in runs),
    }


def saturated_markdown(rows: list[dict[str, Any]]) -> str:
    """The saturated (or paced) runs, each broker row beside the floor row of the same worker count: the
    floor's chunks/s per core over the broker's, and the round trip the broker adds over the floor's."""
    floors = {row["workers"]: row for row in rows if row["router"] == "floor"}
    lines = ["| router | workers | load | chunks/s | router core share | chunks/s per router core | router CPU µs/chunk "
             "| round trip p50 / p99 µs | floor per core / broker per core | added over the floor p50 / p99 µs |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        floor = floors.get(row["workers"])
        against = row["router"] == "broker" and floor is not None
        ratio = (f"{floor['one_core_chunks_per_s'] / row['one_core_chunks_per_s']:.2f}"
                 if against and floor["one_core_chunks_per_s"] and row["one_core_chunks_per_s"] else "-")
        added = (f"{row['round_trip_us']['p50'] - floor['round_trip_us']['p50']:.0f} / "
                 f"{row['round_trip_us']['p99'] - floor['round_trip_us']['p99']:.0f}" if against else "-")
        load = f"{row['rate']:,.0f}/s" if row.get("rate") else f"{row['frontends']}×{row['window']}"
        lines.append(f"| {row['router']} | {row['workers']} | {load} | {row['chunks_per_s']:,} "
                     f"| {row['router_core_share']:.2f} | {row['one_core_chunks_per_s'] or 0:,} "
                     f"| {row['router_cpu_us_per_chunk']} | {row['round_trip_us']['p50']:.0f} / "
                     f"{row['round_trip_us']['p99']:.0f} | {ratio} | {added} |")
    return "\n".join(lines)


def summarize(workers: int, frontends: int, window: int, runs: list[FrontendRun], served: list[dict[str, Any]],
              broker_cpu_s: float) -> dict[str, Any]:
    """Join the frontends' and workers' notes by chunk id into hop times and rates."""
    worker_times: dict[str, tuple[int, int]] = {}
    by_worker: dict[str, int] = {}
    for report in served:
        worker_times.update(report["timings"])
        by_worker.update(report["chunks_by_worker"])
    sent, answered, hop_in, hop_out = [], [], [], []
    for run in runs:
        for chunk_id, (sent_ns, answered_ns) in run.timings.items():
            sent.append(sent_ns)
            answered.append(answered_ns)
            received_ns, replied_ns = worker_times.get(chunk_id, (0, 0))
            if received_ns:
                hop_in.append(received_ns - sent_ns)
                hop_out.append(answered_ns - replied_ns)
    chunks = len(answered)
    wall_s = (max(answered) - min(sent)) / 1e9 if chunks else 0.0
    round_trip = np.asarray(answered, dtype=np.int64) - np.asarray(sent, dtype=np.int64)
    return {
        "workers": workers, "frontends": frontends, "window": window, "chunks": chunks,
        "chunks_per_s": round(chunks / wall_s) if wall_s else 0,
        "hop_in_us": percentile_us(np.asarray(hop_in)), "hop_out_us": percentile_us(np.asarray(hop_out)),
        "round_trip_us": percentile_us(round_trip),
        "broker_cpu_us_per_chunk": round(broker_cpu_s / chunks * 1e6, 1) if chunks and workers else None,
        "broker_core_share": round(broker_cpu_s / wall_s, 2) if wall_s and workers else None,
        "one_core_chunks_per_s": round(chunks / broker_cpu_s) if broker_cpu_s and workers else None,
        "errors": sum(r.errors for r in runs), "wrong_answers": sum(r.wrong_answers for r in runs),
        "unanswered": sum(r.unanswered for r in runs),
        "unmatched": chunks - len(hop_in),
        "workers_used": sum(1 for count in by_worker.values() if count),
        "worker_bad_messages": sum(r["bad_messages"] for r in served),
    }


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| workers | load | chunks/s | frontend→worker p50 / p99 µs | worker→frontend p50 / p99 µs | "
             "round trip p50 / p99 µs | broker CPU µs/chunk | broker core share | chunks/s per broker core |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        label = str(row["workers"]) if row["workers"] else "none (direct)"
        load = f"{row['frontends']}×{row['window']}"
        cpu = "-" if row["broker_cpu_us_per_chunk"] is None else f"{row['broker_cpu_us_per_chunk']:.1f}"
        share = "-" if row["broker_core_share"] is None else f"{row['broker_core_share']:.2f}"
        per_core = "-" if row["one_core_chunks_per_s"] is None else f"{row['one_core_chunks_per_s']:,}"
        hops = " | ".join(f"{row[k]['p50']:.0f} / {row[k]['p99']:.0f}" for k in ("hop_in_us", "hop_out_us", "round_trip_us"))
        lines.append(f"| {label} | {load} | {row['chunks_per_s']:,} | {hops} | {cpu} | {share} | {per_core} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1,2,4,8,16,64", help="stand-in worker counts, comma-separated")
    parser.add_argument("--frontends", type=int, default=2, help="stand-in frontend processes")
    parser.add_argument("--window", type=int, default=32, help="chunks each frontend keeps in flight under load")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each run")
    parser.add_argument("--seqs", type=int, default=4, help="sequences per chunk")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per sequence")
    parser.add_argument("--dim", type=int, default=384, help="width of the stand-in results")
    parser.add_argument("--worker-processes", type=int, default=2, help="processes the stand-in workers share")
    parser.add_argument("--broker-args", default="", help="extra options of `quiver broker`, e.g. '--busy-poll-us 500'")
    parser.add_argument("--broker-tree", default="", help="run the broker from this source tree (a folder "
                        "holding quiver/, broker/, common/ and setup.cfg, e.g. an earlier commit's) for before/after")
    parser.add_argument("--curve", action="store_true", help="CurveZMQ on both broker endpoints (the layout "
                        "of a broker serving other hosts); the direct rows stay plain")
    parser.add_argument("--transport", choices=("tcp", "ipc"), default="tcp", help="the broker's endpoints: "
                        "loopback TCP (the layout of workers on other hosts) or ipc:// (`quiver serve` on one host)")
    parser.add_argument("--saturate", action="store_true", help="instead: peers of pre-encoded frames "
                        "(bench/saturating_peers.py) drive the broker, alone on one CPU, past what it routes, and the "
                        "floor router on the same CPU in the same run; window --saturate-window per frontend")
    parser.add_argument("--saturate-window", type=int, default=64, help="chunks each saturating frontend keeps in flight")
    parser.add_argument("--rate", type=float, default=0.0, help="with --saturate: offer this many chunks/s in all "
                        "(paced, open loop, at most --saturate-window in flight per frontend) instead of a full "
                        "window: the latency the broker adds at that load, beside the floor router's")
    parser.add_argument("--quick", action="store_true", help="1 and 2 workers, 1 s each: a smoke run for CI")
    parser.add_argument("--out", default="", help="folder for broker_capacity.json and .md (default: print only)")
    args = parser.parse_args(argv)
    counts = [1, 2] if args.quick else [int(x) for x in args.workers.split(",")]
    seconds = 1.0 if args.quick else args.seconds
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="quiver-broker-capacity-"))
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / "broker_capacity_broker.log"
    meta = {"cpus": os.cpu_count(), "load_average": os.getloadavg(), "seconds": seconds, "seqs": args.seqs,
            "tokens": args.tokens, "dim": args.dim, "broker_args": args.broker_args, "curve": args.curve,
            "transport": args.transport, "broker_tree": args.broker_tree}
    if args.saturate:
        return _saturate(counts, seconds, args, out, log_path, meta)
    rows = []
    for workers in [0, *counts]:
        for window in (args.window, 1):
            frontends = 1 if workers == 0 and window == 1 else args.frontends
            row = run_once(workers, frontends, window, seconds, args, log_path)
            rows.append(row)
            print(markdown([row]).splitlines()[-1], flush=True)
    table = markdown(rows)
    if args.out:
        (out / "broker_capacity.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        (out / "broker_capacity.md").write_text(table + "\n")
    print(table)
    failed = [r for r in rows if r["errors"] or r["wrong_answers"] or r["unanswered"] or r["worker_bad_messages"]]
    return 1 if failed else 0


def _saturate(counts: list[int], seconds: float, args: argparse.Namespace, out: Path, log_path: Path,
              meta: dict[str, Any]) -> int:
    if args.curve:
        raise SystemExit("--saturate runs plain sockets only")
    rows = []
    for workers in counts:
        for router in ("floor", "broker"):
            row = run_saturated(router, workers, args.frontends, args.saturate_window, seconds, args, log_path)
            rows.append(row)
            print(saturated_markdown([row]).splitlines()[-1], flush=True)
    table = saturated_markdown(rows)
    if args.out:
        (out / "broker_capacity_saturated.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        (out / "broker_capacity_saturated.md").write_text(table + "\n")
    print(table)
    return 1 if any(row["wrong_answers"] or row["unanswered"] or not row["chunks"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
