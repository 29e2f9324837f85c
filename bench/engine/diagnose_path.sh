#!/usr/bin/env bash
# On a GPU machine: serve the BGE-M3 stand-in, break a batch-1 request's time down by stage
# (bench/path_breakdown.py), and sample the frontend, broker and worker with py-spy while they serve.
# Writes breakdown.md and py-spy's raw stacks under $OUT (or bench/out/diagnose).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
OUT=${OUT:-bench/out/diagnose}
mkdir -p "$OUT"
ckpt=$(python3 -m quiver.bench.stand_ins --root /tmp/quiver-diag "${1:-bge-m3-shape}" 2>/dev/null | tail -n 1)
python3 -m quiver serve --model "$ckpt" --device cuda --port 18080 > "$OUT/serve.log" 2>&1 &
server=$!
for _ in $(seq 300); do
  python3 -c "import sys, urllib.request as u; sys.exit(u.urlopen('http://127.0.0.1:18080/health', timeout=2).status != 200)" 2>/dev/null && break
  sleep 1
done
python3 -m quiver.bench.path_breakdown --url http://127.0.0.1:18080 --model "$ckpt" --lengths 128,512,4096 --requests 300 --engine-device cuda | tee "$OUT/breakdown.md"
python3 -m quiver.bench.path_breakdown --url http://127.0.0.1:18080 --model "$ckpt" --lengths 128 --requests 3000 > /dev/null &
load=$!
sleep 3
for role in frontend broker worker; do
  pid=$(pgrep -f "quiver $role" | head -n 1)
  py-spy record -d 6 -r 2000 -f raw --threads -o "$OUT/spy-$role.txt" -p "$pid" > /dev/null 2>&1 &
done
wait $load
kill -TERM $server; wait $server
