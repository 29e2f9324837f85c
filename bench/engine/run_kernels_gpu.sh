#!/usr/bin/env bash
# The engine's compute on one GPU in one go (about four minutes on an H200): the FP8 and quantisation GPU
# tests, the dense products at short inputs (kernel_bench --gemms), and the engine alone at both
# real shapes in bf16 and FP8 (latency, throughput, graph replay cost, and the correctness gate's 12
# real inputs against float32 transformers). Writes into $OUT (default bench/out/kernels).
#
#   bash bench/engine/run_kernels_gpu.sh            # PYTHON, OUT, CKPT (checkpoint folder) may be set
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
OUT=${OUT:-bench/out/kernels}
CKPT=${CKPT:-/tmp/quiver-bench-ckpts}
mkdir -p "$OUT"
status=0
$PY -m pytest -q -p no:cacheprovider -m gpu tests/worker/engine/test_triton_ops.py -k quantize 2>&1 | tee "$OUT/tests.txt" || status=1
QUIVER_ENGINE_CKPT_DIR=$CKPT $PY -m pytest -q -s -p no:cacheprovider -m gpu tests/worker/engine/test_gpu.py -k fp8_graph_replay \
  2>&1 | tee -a "$OUT/tests.txt" || status=1
$PY -m quiver.bench.engine.kernel_bench --gemms --tokens "${GEMM_TOKENS:-128,512}" --out "$OUT/gemms.json" 2>&1 \
  | tee "$OUT/gemms.txt" || status=1
$PY -m quiver.bench.engine_bench --out "$OUT/engine.json" --ckpt-dir "$CKPT" --skip-hf --dtypes bfloat16,fp8 \
  --fusion triton --fp8-min-cosine 0 --gate --iters "${ITERS:-50}" --graph-max-tokens 4096 ${ENGINE_ARGS:-} 2>&1 \
  | grep -v "Writing model shards" | tee "$OUT/engine.txt" || status=1
exit $status
