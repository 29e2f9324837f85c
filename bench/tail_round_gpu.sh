#!/usr/bin/env bash
# One device call on a GPU host: the broker's and the HTTP frontend's capacity on the host's own CPUs, then
# one `quiver serve` of the pplx-embed-0.6B stand-in measured by bench/link_ab_gpu.sh (batch-1 floor at 128 /
# 512 / 4096 tokens, then concurrency) with every process's garbage-collector pauses logged
# (bench/gc_pauses.py). Writes tail-round.txt (every table) and tail-round.tar.gz (raw JSON, logs) to $OUT.
#
#   OUT=$OUT bash bench/tail_round_gpu.sh [NAME:VAR=VALUE,... as for link_ab_gpu.sh]
#   environment: SKIP_CAPACITY=1 leaves out the two CPU benchmarks; LEVELS, CLIENT_REQUESTS, REQUESTS as
#   for link_ab_gpu.sh (default here 1,4,8,16,64 clients × 200 requests).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" PYTHONUNBUFFERED=1
OUT=${OUT:-bench/out/tail-round}
WORK=${WORK:-/tmp/quiver-tail-round}
mkdir -p "$OUT" "$WORK"
log="$OUT/tail-round.txt"
if [ -z "${SKIP_CAPACITY:-}" ]; then
  echo "## broker capacity ($(nproc) CPUs)" | tee -a "$log"
  timeout 150 python3 -m quiver.bench.broker_capacity --workers 1,8,64 --frontends 4 --worker-processes 4 \
    --seconds 3 --out "$WORK/broker_capacity.json" > "$WORK/broker_capacity.log" 2>&1
  grep "^|" "$WORK/broker_capacity.log" | tail -n 8 | tee -a "$log" || tail -n 5 "$WORK/broker_capacity.log"
  echo "## frontend processes" | tee -a "$log"
  ckpt=$(python3 -m quiver.bench.stand_ins --root "$WORK/ab-work" --device cpu pplx-embed-0.6b-shape | tail -n 1)
  timeout 150 python3 -m quiver.bench.frontend_scaling --model "$ckpt" --processes 1,2,4,8 --clients 4 --connections 16 --seconds 5 \
    --out "$WORK/frontend_scaling" > "$WORK/frontend_scaling.log" 2>&1
  grep "^|" "$WORK/frontend_scaling.log" | tail -n 4 | tee -a "$log" || tail -n 5 "$WORK/frontend_scaling.log"
fi
site=$(python3 -m quiver.bench.gc_pauses install "$WORK/gc")
GC_PAUSES="$WORK/gc" PYTHONPATH="$site:$PYTHONPATH" OUT="$WORK/ab" WORK="$WORK/ab-work" \
  LEVELS=${LEVELS:-1,4,8,16,64} CLIENT_REQUESTS=${CLIENT_REQUESTS:-200} ROUNDS=1 \
  timeout 420 bash bench/link_ab_gpu.sh "${@:-default:QUIVER_LINK_THREAD=auto}"
cat "$WORK/ab/link-ab.txt" >> "$log"
echo "## garbage-collector pauses (the window: from the servers being up to the end)" | tee -a "$log"
python3 -m quiver.bench.gc_pauses summary "$WORK/gc" --since "$(cat "$WORK/ab-work/traffic-since")" | tee -a "$log"
tar czf "$OUT/tail-round.tar.gz" -C "$WORK" --exclude="ab-work/pplx-embed-0.6b-shape" --exclude="*.safetensors" .
