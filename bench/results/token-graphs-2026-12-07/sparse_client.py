"""Batch-1 /embed, /embed_sparse and /embed_all of one text against a server: p50 / p99 ms and the last
response's bytes, per route and text length.

    python sparse_client.py PORT LABEL [--words 24,100,400] [--routes /embed,/embed_sparse,/embed_all]
                                       [--requests 130] [--untimed 30]
"""
import argparse, http.client, json, statistics, time

parser = argparse.ArgumentParser()
parser.add_argument("port", type=int)
parser.add_argument("label")
parser.add_argument("--words", default="24,100,400")
parser.add_argument("--routes", default="/embed,/embed_sparse,/embed_all")
parser.add_argument("--requests", type=int, default=130)
parser.add_argument("--untimed", type=int, default=30)
args = parser.parse_args()
words = ("the quick brown fox jumps over the lazy dog while numbers and letters mix in the index " * 20).split()
res = {}
for n_words in map(int, args.words.split(",")):
    text = " ".join(words[:n_words])
    for route in args.routes.split(","):
        conn = http.client.HTTPConnection("127.0.0.1", args.port)
        body = json.dumps({"inputs": text})
        times = []
        for i in range(args.requests):
            t = time.perf_counter()
            conn.request("POST", route, body, {"Content-Type": "application/json"})
            r = conn.getresponse(); data = r.read()
            if r.status != 200: raise SystemExit(f"{route} {r.status} {data[:200]}")
            if i >= args.untimed: times.append((time.perf_counter() - t) * 1e3)
        times.sort()
        res[f"{route} {n_words}w"] = (round(statistics.median(times), 2), round(times[int(0.99 * len(times)) - 1], 2), len(data))
print(args.label, json.dumps(res))
