"""Scoring on the GPU: per 25- and 50-document request, the worker's busy time, steps, eager steps."""
import argparse, json, re, sys, time, statistics
from pathlib import Path
import httpx, torch
from quiver.bench import score_bench as sb
from quiver.bench.local_server import free_port

def worker_counters(port):
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    out = {}
    for name in ("busy_seconds_total", "step_seconds_count", "step_seconds_sum", "eager_steps_total",
                 "graph_replays_total", "queued_steps_total"):
        total = 0.0
        for line in text.splitlines():
            if line.startswith("quiver_worker_" + name):
                total += float(line.rsplit(" ", 1)[1])
        out[name] = total
    return out

def main():
    config = sys.argv[1]
    args = argparse.Namespace(device="cuda", startup_timeout_s=600, serve_args="")
    wport = free_port()
    args.serve_args = f"--worker-metrics-port {wport} " + config
    model = sb.build_model("cuda", 0)
    path = sb.write_checkpoint(model, Path("/tmp/ckpts"))
    del model; torch.cuda.empty_cache()
    server, url = sb.start_quiver(path, args, Path(f"/tmp/probe-{abs(hash(config))}.log"))
    raw = sb.RawClient(url)
    try:
        for count in (25, 50):
            query, documents = sb.workload(count, seed=count)
            body = json.dumps({"query": query, "texts": documents, "truncate": False}).encode()
            for _ in range(10):
                raw.post("/rerank", body)
            before = worker_counters(wport)
            lat, stages = [], []
            for _ in range(30):
                t = time.perf_counter(); status, headers, _ = raw.post("/rerank", body); lat.append((time.perf_counter() - t) * 1e3)
                stages.append([float(headers[h]) for h in sb.STAGE_HEADERS])
                time.sleep(0.01)
            after = worker_counters(wport)
            per = {k: round((after[k] - before[k]) / 30, 4) for k in after}
            med = [round(statistics.median(s[i] for s in stages), 2) for i in range(4)]
            share = sb.first_share(httpx.Client(), url) if hasattr(sb, "first_share") else None
            print(f"{config or 'default'} | share {share} | {count} docs | p50 {statistics.median(lat):.2f} ms | total/tok/queue/inf {med} | per request: busy {per['busy_seconds_total']*1e3:.2f} ms, steps {per['step_seconds_count']}, step sum {per['step_seconds_sum']*1e3:.2f} ms, eager {per['eager_steps_total']}, replays {per['graph_replays_total']}, queued {per['queued_steps_total']}", flush=True)
    finally:
        raw.close(); sb.stop_quiver(server)

main()
