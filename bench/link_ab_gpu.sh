#!/usr/bin/env bash
# On one GPU: the worker's two link arrangements (worker/link.py) side by side, same machine, same run.
#
# Two `quiver serve` of the pplx-embed-0.6B stand-in share the GPU (0.4 of its memory each): one with the
# broker socket on a thread of its own (QUIVER_LINK_THREAD=on, the arrangement before), one polled from
# the scheduler's thread (off, the GPU default). Then, alternating between them for ROUNDS rounds:
# bench/floor.py (the floors, then the batch-1 overhead over the worker's step at 128 / 512 / 4096
# tokens) and `quiver bench`'s concurrency benchmark (single 512-token texts, 1 / 4 / 16 clients).
# The server not being measured sits idle. Writes link-ab.txt (the tables) and link-ab.tar.gz (floor-*.json,
# concurrency-*.json, the servers' logs) to $OUT.
#
#   ROUNDS=2 bash bench/link_ab_gpu.sh
#   DEVICE=cpu STAND_IN_ARGS=--small REQUESTS=20 ROUNDS=1 bash bench/link_ab_gpu.sh     # a try on a CPU
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
OUT=${OUT:-bench/out/link-ab}
WORK=${WORK:-/tmp/quiver-link-ab}
ROUNDS=${ROUNDS:-2}
REQUESTS=${REQUESTS:-200}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT" "$WORK/results"
log="$OUT/link-ab.txt"
# shellcheck disable=SC2086
ckpt=$(python3 -m quiver.bench.stand_ins --root "$WORK" --device "$DEVICE" ${STAND_IN_ARGS:-} pplx-embed-0.6b-shape | tail -n 1)
declare -A port=([on]=18081 [off]=18082) pid=()
for mode in on off; do
  QUIVER_LINK_THREAD=$mode python3 -m quiver serve --model "$ckpt" --device "$DEVICE" --port "${port[$mode]}" \
    --gpu-memory-fraction 0.4 > "$WORK/results/serve-$mode.log" 2>&1 &
  pid[$mode]=$!
done
for mode in on off; do
  for _ in $(seq 600); do
    python3 -c "import sys, urllib.request as u; sys.exit(u.urlopen('http://127.0.0.1:${port[$mode]}/health', timeout=2).status != 200)" 2>/dev/null && break
    sleep 1
  done
done
for round in $(seq "$ROUNDS"); do
  for mode in on off; do
    echo "## link thread $mode, round $round" | tee -a "$log"
    python3 -m quiver.bench.floor --url "http://127.0.0.1:${port[$mode]}" --server-pid "${pid[$mode]}" \
      --model "$ckpt" --device "$DEVICE" --lengths 128,512,4096 --requests "$REQUESTS" --modes blocking \
      --json "$WORK/results/floor-$mode-$round.json" 2>&1 | tee -a "$log"
    bench="$WORK/bench-$mode-$round"
    python3 -m quiver bench --url "http://127.0.0.1:${port[$mode]}" --model "$ckpt" --benchmarks concurrency \
      --concurrency-levels 1,4,16 --concurrency-requests 100 --baselines none --out "$bench" > "$bench.log" 2>&1
    grep -i -A8 "concurren" "$bench/results.md" | head -24 | tee -a "$log"
    cp "$bench/results.json" "$WORK/results/concurrency-$mode-$round.json" 2>/dev/null
  done
done
for mode in on off; do kill -TERM "${pid[$mode]}"; done
wait
tar czf "$OUT/link-ab.tar.gz" -C "$WORK" results
