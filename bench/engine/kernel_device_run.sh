#!/usr/bin/env bash
# One device call for the elementwise kernels: the kernel benchmark, the Triton GPU tests, then whole
# engine steps with each fused set. Logs and JSON land in $OUT. Usage: bash bench/engine/kernel_device_run.sh
set -u
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/quiver-out}
mkdir -p "$OUT"
start=$(date +%s)
timeout "${BENCH_TIMEOUT:-150}" python3 -m quiver.bench.engine.kernel_bench --out "$OUT/kernel_bench.json" \
    > "$OUT/kernel_bench.log" 2>&1
echo "kernel bench exit $? after $(( $(date +%s) - start )) s"
grep -E "^\||copy|Error|error" "$OUT/kernel_bench.log" | tail -30
timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -q -p no:cacheprovider -m gpu tests/worker/engine/test_triton_ops.py \
    > "$OUT/triton_tests.log" 2>&1
echo "triton gpu tests exit $? after $(( $(date +%s) - start )) s"
grep -E "passed|failed|Error|assert" "$OUT/triton_tests.log" | tail -15
timeout "${ENGINE_TIMEOUT:-150}" python3 -m quiver.bench.engine.kernel_bench --engine /tmp/quiver-kernel-ckpts \
    --fusion "${ENGINE_FUSION:-triton,compile}" \
    --out "$OUT/kernel_engine.json" > "$OUT/kernel_engine.log" 2>&1
echo "engine steps exit $? after $(( $(date +%s) - start )) s"
grep -E "^engine:|fusion probe|Error|error" "$OUT/kernel_engine.log" | tail -12
