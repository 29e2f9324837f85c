#!/usr/bin/env bash
# On one GPU: several server configurations side by side, same machine, same run (for the worker's two
# link arrangements, worker/link.py, and the busy-poll window).
#
# One `quiver serve` of the pplx-embed-0.6B stand-in per configuration, sharing the GPU; then, alternating
# between them for ROUNDS rounds: bench/floor.py (the floors, then the batch-1 overhead over the worker's
# step at 128 / 512 / 4096 tokens) and the concurrency benchmark of `quiver bench` (quiver.bench.cli:
# single 512-token texts, 1 / 4 / 16 clients; FLOOR=0 leaves the floor out). The servers not being measured
# sit idle. A configuration is NAME:VAR=VALUE,VAR=VALUE
# (QUIVER_* variables of `quiver serve` and its children). LEVELS and CLIENT_REQUESTS set the concurrency
# benchmark's client counts and requests per client (default 1,4,16 and 100). Writes link-ab.txt (the tables) and
# link-ab.tar.gz (floor-*.json, concurrency-*.json, the servers' logs) to $OUT. After each configuration's
# concurrency run its worker's counters since start (steps, chunks, busy seconds, graph use) are printed.
#
#   ROUNDS=2 bash bench/link_ab_gpu.sh thread:QUIVER_LINK_THREAD=on inline:QUIVER_LINK_THREAD=off
#   FLOOR=0 LEVELS=1,4,8,16 CLIENT_REQUESTS=200 bash bench/link_ab_gpu.sh one:QUIVER_HTTP_PROCESSES=1 two:QUIVER_HTTP_PROCESSES=2
#   DEVICE=cpu STAND_IN_ARGS=--small REQUESTS=20 ROUNDS=1 bash bench/link_ab_gpu.sh a:QUIVER_LINK_THREAD=on b:QUIVER_LINK_THREAD=off
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
OUT=${OUT:-bench/out/link-ab}
WORK=${WORK:-/tmp/quiver-link-ab}
ROUNDS=${ROUNDS:-2}
REQUESTS=${REQUESTS:-200}
DEVICE=${DEVICE:-cuda}
LEVELS=${LEVELS:-1,4,16}
CLIENT_REQUESTS=${CLIENT_REQUESTS:-100}
FLOOR=${FLOOR:-1}
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(thread:QUIVER_LINK_THREAD=on inline:QUIVER_LINK_THREAD=off)
mkdir -p "$OUT" "$WORK/results"
log="$OUT/link-ab.txt"
# shellcheck disable=SC2086
ckpt=$(python3 -m quiver.bench.stand_ins --root "$WORK" --device "$DEVICE" ${STAND_IN_ARGS:-} pplx-embed-0.6b-shape | tail -n 1)
fraction=$(python3 -c "print(round(0.85 / ${#configs[@]}, 2))")
declare -A port=() pid=()
next_port=18081
for config in "${configs[@]}"; do
  name=${config%%:*}
  port[$name]=$next_port
  next_port=$((next_port + 1))
  IFS=, read -r -a assignments <<< "${config#*:}"
  env "${assignments[@]}" python3 -m quiver serve --model "$ckpt" --device "$DEVICE" --port "${port[$name]}" \
    --gpu-memory-fraction "$fraction" --broker-metrics-port 0 --worker-metrics-port "$((port[$name] + 1000))" \
    > "$WORK/results/serve-$name.log" 2>&1 &
  pid[$name]=$!
done
# shellcheck source=bench/serve_ready.sh
. bench/serve_ready.sh
for name in "${!port[@]}"; do
  if ! healthy_within "${pid[$name]}" "${port[$name]}" 600; then  # say why, stop the others
    echo "## $name: the server did not become ready (it exited, or 600 s passed)" | tee -a "$log"; tail -n 20 "$WORK/results/serve-$name.log" | tee -a "$log"
    kill -TERM "${pid[@]}" 2> /dev/null; wait; exit 1
  fi
done
echo "servers up after ${SECONDS} s" | tee -a "$log"
python3 -c "import time; print(time.monotonic())" > "$WORK/traffic-since"  # for tools that split by phase
for round in $(seq "$ROUNDS"); do
  for config in "${configs[@]}"; do
    name=${config%%:*}
    echo "## $config, round $round" | tee -a "$log"
    if [ "$FLOOR" = 1 ]; then
      python3 -m quiver.bench.floor --url "http://127.0.0.1:${port[$name]}" --server-pid "${pid[$name]}" \
        --model "$ckpt" --device "$DEVICE" --lengths 128,512,4096 --requests "$REQUESTS" --modes blocking \
        --json "$WORK/results/floor-$name-$round.json" 2>&1 | tee -a "$log"
    fi
    bench="$WORK/bench-$name-$round"
    python3 -m quiver.bench.cli --url "http://127.0.0.1:${port[$name]}" --model "$ckpt" --benchmarks concurrency \
      --concurrency-levels "$LEVELS" --concurrency-requests "$CLIENT_REQUESTS" --baselines none --out "$bench" > "$bench.log" 2>&1
    grep -i -A8 "^## concurren" "$bench/results.md" | tee -a "$log"
    echo "worker's counters since start: $(worker_counters "$((port[$name] + 1000))")" | tee -a "$log"
    cp "$bench/results.json" "$WORK/results/concurrency-$name-$round.json" 2>/dev/null
  done
done
for name in "${!pid[@]}"; do kill -TERM "${pid[$name]}"; done
wait
tar czf "$OUT/link-ab.tar.gz" -C "$WORK" results
