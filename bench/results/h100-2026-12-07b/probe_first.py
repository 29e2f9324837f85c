"""A fresh server's first requests in order: client ms and the server's own stages (ms)."""
import http.client, json, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
words = open(sys.argv[3]).read().split()
conn = http.client.HTTPConnection("127.0.0.1", port)
out = []
for i in range(n):
    text = " ".join(words[i * 7 % 500:][:390])  # ~512 tokens
    t = time.perf_counter()
    conn.request("POST", "/v1/embeddings", json.dumps({"input": text, "model": "m"}), {"Content-Type": "application/json"})
    r = conn.getresponse(); r.read()
    c = (time.perf_counter() - t) * 1e3
    out.append((c, r.getheader("x-total-time"), r.getheader("x-tokenization-time"), r.getheader("x-inference-time"), r.status))
    time.sleep(0.003)
for i, row in enumerate(out[:12]):
    print(i, "client %.2f total %s tok %s inf %s status %s" % row)
rest = sorted(x[0] for x in out[12:])
print("rest: p50 %.2f p90 %.2f max %.2f" % (rest[len(rest) // 2], rest[int(len(rest) * .9)], rest[-1]))
