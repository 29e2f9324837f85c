#!/usr/bin/env bash
# The HTTP benchmark suite on a GPU machine: one H200, or two (one worker per GPU, one broker).
#
# For each stand-in (random weights of a published model's shape, see bench/stand_ins.py): write its
# checkpoint, start `quiver serve --device cuda` on it, run `quiver bench` against it with the
# transformers and sentence-transformers baselines on cuda:0, then stop the server. Expect about four
# minutes per stand-in on one H200 (server start-up included); a device command may run ten.
#
#   bash bench/run_gpu.sh [STAND_IN ...]
#       STAND_IN: pplx-embed-0.6b-shape, bge-m3-shape (the two defaults), bge-reranker-v2-m3-shape
#   environment: OUT (default bench/out/gpu), SERVE_ARGS (more `quiver serve` options; with
#       "--worker-metrics-port P" also set WORKER_METRICS_PORT=P to keep the worker's counters), BENCH_ARGS (more
#       `quiver bench` options, e.g. "--baselines none" on the two-GPU run), QUIVER_BENCH_* (any bench option);
#       DEVICE=cpu STAND_IN_ARGS=--small tries the whole script on a CPU with narrow two-layer stand-ins.
#
# Writes three files into $OUT (the device tool brings back at most eight), <N> being 1gpu, 2gpu or cpu:
#   bench-<N>.tar.gz   each stand-in's results.json, results.md, PNG plots and server log
#   summary-<N>.md     each stand-in's results.md, one after another
#   log-<N>.txt        this script's output
#
# With the device tool: its image lacks some of the server's packages. Fetch them once, here:
#   ../shared/tools/device-wheels pyzmq starlette uvicorn httptools orjson pydantic pydantic-core annotated-types typing-inspection typing-extensions
# then run (carry [".whl"]):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD || exit; bash bench/run_gpu.sh pplx-embed-0.6b-shape
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
OUT=${OUT:-bench/out/gpu}
WORK=${WORK:-/tmp/quiver-bench}
PORT=${PORT:-18080}
DEVICE=${DEVICE:-cuda}
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(pplx-embed-0.6b-shape bge-m3-shape)

if [ "$DEVICE" = cuda ]; then
  gpus=$($PY -c "import torch; print(torch.cuda.device_count())") || exit 2
  [ "$gpus" -gt 0 ] || { echo "run_gpu.sh: no GPU is visible" >&2; exit 2; }
  machine="${gpus}gpu"
  hardware="$gpus x $($PY -c "import torch; print(torch.cuda.get_device_name(0))")"
else
  machine=cpu
  hardware=cpu
fi
mkdir -p "$OUT" "$WORK/results"
log="$OUT/log-$machine.txt"

logged() {  # run a command, its output to the terminal and the log; its own exit status
  "$@" 2>&1 | tee -a "$log"
  return "${PIPESTATUS[0]}"
}

# shellcheck source=bench/serve_ready.sh
. bench/serve_ready.sh

status=0
for name in "${names[@]}"; do
  echo "=== $name on $hardware" | tee -a "$log"
  started=$SECONDS
  # shellcheck disable=SC2086  # STAND_IN_ARGS, SERVE_ARGS and BENCH_ARGS are word lists
  ckpt=$($PY -m quiver.bench.stand_ins --root "$WORK/ckpts" --device "$DEVICE" ${STAND_IN_ARGS:-} "$name" 2>>"$log" | tail -n 1)
  [ -d "$ckpt" ] || { echo "run_gpu.sh: no checkpoint for $name" | tee -a "$log"; status=1; continue; }
  result="$WORK/results/$name-$machine"
  mkdir -p "$result"
  # shellcheck disable=SC2086
  $PY -m quiver serve --model "$ckpt" --device "$DEVICE" --port "$PORT" ${SERVE_ARGS:-} > "$result/serve.log" 2>&1 &
  server=$!
  if healthy_within "$server" "$PORT" 420; then
    echo "server up after $((SECONDS - started)) s" | tee -a "$log"
    # shellcheck disable=SC2086
    logged $PY -m quiver.bench.cli --url "http://127.0.0.1:$PORT" --model "$ckpt" --baseline-device "$DEVICE" \
      --baseline-time-limit-s 5 --out "$result" --label "$name, $hardware" --no-progress ${BENCH_ARGS:-} \
      || status=1
  else
    echo "run_gpu.sh: the server on $name did not become healthy; its log ends:" | tee -a "$log"
    tail -n 40 "$result/serve.log" | tee -a "$log"
    status=1
  fi
  if [ -n "${WORKER_METRICS_PORT:-}" ]; then  # the worker's own counters over the run: steps, chunks per step, busy time
    $PY -c "import urllib.request as u; print(''.join(l for l in u.urlopen('http://127.0.0.1:$WORKER_METRICS_PORT/metrics').read().decode().splitlines(True) if l.startswith(('quiver_worker_step_', 'quiver_worker_busy', 'quiver_worker_graph', 'quiver_worker_eager', 'quiver_worker_startup', 'quiver_worker_batch_sequences_'))))" \
      > "$result/worker-metrics.txt" 2>&1
  fi
  kill -TERM "$server" 2>/dev/null
  wait "$server"
  echo "=== $name done in $((SECONDS - started)) s" | tee -a "$log"
done
tar czf "$OUT/bench-$machine.tar.gz" -C "$WORK/results" .
cat "$WORK"/results/*-"$machine"/results.md > "$OUT/summary-$machine.md" 2>/dev/null
exit $status
