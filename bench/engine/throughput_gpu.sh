#!/usr/bin/env bash
# One device call on where the engine's throughput goes: the engine benchmark (latency, throughput, graph
# replay; fusion chosen at start-up), then profile_kernels on large eager steps for each fusion set and
# BLAS library. Logs land in $OUT; a short summary is printed.
#
#   bash bench/engine/throughput_gpu.sh
#   environment: OUT (default /tmp/quiver-out), SHAPES (default 1x4096,32x512,4x4096), FUSIONS (default
#       compile,triton), BLAS (default cublas,cublaslt), BENCH_ARGS (more engine_bench options)
set -u
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
CKPTS=${CKPTS:-/tmp/quiver-bench-ckpts}
OUT=${OUT:-/tmp/quiver-out}
mkdir -p "$OUT"
start=$SECONDS
# shellcheck disable=SC2086  # BENCH_ARGS is a word list
timeout "${BENCH_TIMEOUT:-240}" python3 -m quiver.bench.engine_bench --skip-hf --iters 50 --ckpt-dir "$CKPTS" \
    --out "$OUT/engine_bench.json" ${BENCH_ARGS:-} > "$OUT/engine_bench.log" 2>&1
echo "engine_bench exit $? after $((SECONDS - start)) s"
grep -E "engine (latency|throughput)|graph replay|engine ready|start-up took|Traceback|Error" "$OUT/engine_bench.log" \
    | sed -E 's/^[0-9-]+ [0-9:,]+ //' | cut -c1-400
timeout "${PROFILE_TIMEOUT:-300}" python3 -m quiver.bench.engine.profile_kernels --ckpt-dir "$CKPTS" \
    --shapes "${SHAPES:-1x4096,32x512,4x4096}" --fusion "${FUSIONS:-compile,triton}" --blas "${BLAS:-cublas,cublaslt}" \
    --top 10 > "$OUT/profile_kernels.log" 2>&1
echo "profile_kernels exit $? after $((SECONDS - start)) s"
grep -v -i "warn" "$OUT/profile_kernels.log" | grep -E "^==|tokens:|Traceback|Error" | cut -c1-300
