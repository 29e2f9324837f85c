#!/usr/bin/env bash
# One device call: the GPU tests of the graph set and the LazyTensor pipeline, then the
# concurrency and batch-1 latency benchmarks on a freshly started server (concurrency first, so that its
# first run is the server's first traffic), with the worker's step and busy-time counters after it.
#   OUT=$OUT bash bench/engine/tail_run.sh        (TESTS, STAND_IN, BENCH_ARGS, *_TIMEOUT to change it)
set -u
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
OUT=${OUT:-/tmp/quiver-out}
mkdir -p "$OUT"
start=$(date +%s)
if [ "${TESTS:-all}" != none ]; then
  timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -x -s -p no:cacheprovider tests/worker/engine/test_gpu.py \
    -k "${TESTS:-replay or mixed or pipeline or eagerly}" > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests exit $? after $(( $(date +%s) - start )) s"
  grep -E "graphs|mixed stream|pipeline:|passed|failed|Error|assert" "$OUT/gpu_tests.log" | cut -c1-300 | tail -30
fi
WORKER_METRICS_PORT=19100 SERVE_ARGS="--worker-metrics-port 19100 ${SERVE_ARGS:-}" \
  BENCH_ARGS="${BENCH_ARGS:---benchmarks concurrency,latency --baselines transformers}" OUT="$OUT" \
  timeout "${BENCH_TIMEOUT:-420}" bash bench/run_gpu.sh "${STAND_IN:-pplx-embed-0.6b-shape}" > "$OUT/bench.log" 2>&1
echo "bench exit $? after $(( $(date +%s) - start )) s"
grep -E "server up|concurrency|latency|done in|Error|error" "$OUT/bench.log" | tail -30
cat "$OUT"/summary-*.md 2>/dev/null
grep -hE "captured|start-up took|engine ready|Traceback|Error" /tmp/quiver-bench/results/*/serve.log | cut -c1-600 | head -20
cat /tmp/quiver-bench/results/*/worker-metrics.txt 2>/dev/null | grep -v "_bucket"
