#!/usr/bin/env bash
# One device call: batch 1 at both shapes and concurrency up to 64 clients, this tree beside an earlier one.
#
# For each stand-in in SHAPES (default: the pplx-embed-0.6B shape, then the BGE-M3 shape), `quiver serve`
# of this tree and, with BASE set, of the tree unpacked from the tar file BASE (`git archive REV -o FILE`),
# both on the GPU at once. On the first shape this tree's fresh server first runs the concurrency
# benchmark (single 512-token texts, LEVELS clients × CLIENT_REQUESTS requests; its first run is the
# server's first traffic), then bench/floor.py measures each server in turn for ROUNDS rounds, the order
# reversed every other round so that a host's drift falls on both trees alike (token ids on
# /v1/embeddings and /embed, a text of each length; the floors of the run). The worker's graph, step and
# busy counters are printed before and after the traffic. A round or shape that would not finish before
# DEADLINE seconds is left out. Writes batch1.txt (every table) and the JSON files to $OUT.
#
#   OUT=$OUT BASE=.base.tar bash bench/batch1_gpu.sh
#   DEVICE=cpu STAND_IN_ARGS=--small REQUESTS=20 LEVELS=1,4 CLIENT_REQUESTS=10 bash bench/batch1_gpu.sh  (a CPU try)
set -uo pipefail
cd "$(dirname "$0")/.."
NEW=$PWD
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$NEW" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
OUT=${OUT:-bench/out/batch1}
WORK=${WORK:-/tmp/quiver-batch1}
DEVICE=${DEVICE:-cuda}
SHAPES=${SHAPES:-pplx-embed-0.6b-shape,bge-m3-shape}
LENGTHS=${LENGTHS:-128,512,4096}
REQUESTS=${REQUESTS:-200}
ROUNDS=${ROUNDS:-2}
LEVELS=${LEVELS:-1,4,8,16,64}
CLIENT_REQUESTS=${CLIENT_REQUESTS:-200}
DEADLINE=${DEADLINE:-540}
mkdir -p "$OUT" "$WORK"
# shellcheck source=bench/serve_ready.sh
. bench/serve_ready.sh
log="$OUT/batch1.txt"
say() { echo "$*" | tee -a "$log"; }
trees=(new)
if [ -n "${BASE:-}" ]; then
  rm -rf "$WORK/base" && mkdir -p "$WORK/base" && tar -xf "$BASE" -C "$WORK/base" && trees=(base new)
fi
tree_dir() { if [ "$1" = base ]; then echo "$WORK/base"; else echo "$NEW"; fi; }
fraction=$(python3 -c "print(round(0.85 / ${#trees[@]}, 2))")
metrics() { worker_counters "$1" | tee -a "$log"; }  # the worker's counters, one line, labels left out
declare -A port=() metrics_port=() pid=()
IFS=, read -r -a shapes <<< "$SHAPES"
for shape_index in "${!shapes[@]}"; do
  shape=${shapes[$shape_index]}
  if [ "$SECONDS" -gt $((DEADLINE - 150)) ]; then say "## $shape: left out, ${SECONDS} s gone"; continue; fi
  # shellcheck disable=SC2086
  ckpt=$(python3 -m quiver.bench.stand_ins --root "$WORK/checkpoints" --device "$DEVICE" ${STAND_IN_ARGS:-} "$shape" | tail -n 1)
  for i in "${!trees[@]}"; do
    tree=${trees[$i]}
    port[$tree]=$((18180 + i)); metrics_port[$tree]=$((19180 + i))
    dir=$(tree_dir "$tree")
    (cd "$dir" && PYTHONPATH="${PYTHONPATH/$NEW/$dir}" exec python3 -m quiver serve --model "$ckpt" --device "$DEVICE" \
       --port "${port[$tree]}" --gpu-memory-fraction "$fraction" --broker-metrics-port 0 \
       --worker-metrics-port "${metrics_port[$tree]}" > "$WORK/serve-$shape-$tree.log" 2>&1) &
    pid[$tree]=$!
  done
  for tree in "${trees[@]}"; do
    if ! healthy_within "${pid[$tree]}" "${port[$tree]}" 600; then
      say "## $shape: the $tree tree's server did not become ready (it exited, or 600 s passed)"; tail -n 20 "$WORK/serve-$shape-$tree.log" | tee -a "$log"
      kill -TERM "${pid[@]}" 2> /dev/null; wait; exit 1
    fi
  done
  say "## $shape: servers up after ${SECONDS} s ($(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo "$DEVICE"))"
  say "### the new tree's worker before traffic"; metrics "${metrics_port[new]}"
  if [ "$shape_index" = 0 ]; then
    say "### concurrency, the new tree's fresh server, single 512-token texts"
    timeout 200 python3 -m quiver.bench.cli --url "http://127.0.0.1:${port[new]}" --model "$ckpt" --benchmarks concurrency \
      --concurrency-levels "$LEVELS" --concurrency-requests "$CLIENT_REQUESTS" --baselines none --out "$WORK/concurrency" \
      > "$WORK/concurrency.log" 2>&1
    grep -i -A12 "^## concurren" "$WORK/concurrency/results.md" | tee -a "$log"
    cp "$WORK/concurrency/results.json" "$OUT/concurrency-$shape.json" 2>/dev/null
    say "### the new tree's worker after the concurrency benchmark"; metrics "${metrics_port[new]}"
  fi
  for round in $(seq "$ROUNDS"); do
    if [ "$round" -gt 1 ] && [ "$SECONDS" -gt $((DEADLINE - 120 * ${#trees[@]})) ]; then break; fi
    order=("${trees[@]}")
    if [ $((round % 2)) = 0 ]; then mapfile -t order < <(printf '%s\n' "${trees[@]}" | tac); fi
    for tree in "${order[@]}"; do
      say "### floor, $shape, $tree tree, round $round (${SECONDS} s)"
      timeout 150 python3 -m quiver.bench.floor --url "http://127.0.0.1:${port[$tree]}" --server-pid "${pid[$tree]}" \
        --model "$ckpt" --device "$DEVICE" --lengths "$LENGTHS" --requests "$REQUESTS" --modes blocking \
        --json "$OUT/floor-$shape-$tree-$round.json" 2>&1 | grep "^|" | tee -a "$log"
    done
  done
  say "### the new tree's worker at the end"; metrics "${metrics_port[new]}"
  for tree in "${trees[@]}"; do kill -TERM "${pid[$tree]}"; done
  wait
done
say "done after ${SECONDS} s"
