"""Batch-1 /embed_sparse, /embed_all and /embed of one text against a server; p50/p99 ms and the response bytes per route."""
import http.client, json, statistics, sys, time
port, label = int(sys.argv[1]), sys.argv[2]
words = ("the quick brown fox jumps over the lazy dog while numbers and letters mix in the index " * 20).split()
res = {}
for n_words in (400,):
    text = " ".join(words[:n_words])
    for route in ("/embed_sparse", "/embed_all"):
        conn = http.client.HTTPConnection("127.0.0.1", port)
        body = json.dumps({"inputs": text})
        times = []
        for i in range(80):
            t = time.perf_counter()
            conn.request("POST", route, body, {"Content-Type": "application/json"})
            r = conn.getresponse(); data = r.read()
            if r.status != 200: raise SystemExit(f"{route} {r.status} {data[:200]}")
            if i >= 20: times.append((time.perf_counter() - t) * 1e3)
        times.sort()
        res[f"{route} {n_words}w"] = (round(statistics.median(times), 2), round(times[int(0.99 * len(times)) - 1], 2), len(data))
print(label, json.dumps(res))
