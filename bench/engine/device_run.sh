#!/usr/bin/env bash
# One device call: environment check, the engine benchmark, then the GPU tests (reusing its checkpoints).
# Logs and the benchmark JSON land in $OUT. Usage: bash bench/engine/device_run.sh [bench args...]
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 QUIVER_ENGINE_CKPT_DIR=/tmp/quiver-bench-ckpts
OUT=${OUT:-/tmp/quiver-out}
mkdir -p "$OUT"
start=$(date +%s)
python3 bench/engine/device_check.py 2>&1 | tee "$OUT/device_check.log"
timeout "${BENCH_TIMEOUT:-300}" python3 -m quiver.bench.engine_bench --out "$OUT/engine_bench.json" \
    --ckpt-dir "$QUIVER_ENGINE_CKPT_DIR" "$@" > "$OUT/engine_bench.log" 2>&1
echo "bench exit $? after $(( $(date +%s) - start )) s"
grep -v "Writing\|Loading" "$OUT/engine_bench.log" | grep -i "fusion probe\|start-up\|gpu memory\|latency\|launch\|throughput\|error\|Traceback\|^|" | tail -40
timeout "${PROFILE_TIMEOUT:-90}" python3 -m quiver.bench.engine.profile_kernels --ckpt-dir "$QUIVER_ENGINE_CKPT_DIR" \
    > "$OUT/profile_kernels.log" 2>&1
echo "profile exit $? after $(( $(date +%s) - start )) s"
cat "$OUT/profile_kernels.log" | grep -v Warn | tail -60
timeout "${TEST_TIMEOUT:-240}" python3 -m pytest -q -x -s -p no:cacheprovider tests/worker/engine/test_gpu.py \
    > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests exit $? after $(( $(date +%s) - start )) s"
grep -E "cosines|bit-identical|pipeline:|passed|failed|Error|assert" "$OUT/gpu_tests.log" | tail -40
