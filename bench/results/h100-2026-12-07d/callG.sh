#!/usr/bin/env bash
# Next GPU call: the op-variant tests not yet run on a GPU (graph replay of both variants), the residual
# epilogue's kernel table, the engine alone on the pplx-embed shape (tree at BASE tar, then this one), and
# the Triton GEMM probe (tiled / persistent / warp-specialised against cuBLAS).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
NEW=$PWD
export PYTHONPATH=/tmp/site:$NEW
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rA tests/worker/engine/test_op_variants.py \
  tests/worker/engine/test_swiglu_product.py > "$OUT/tests.txt" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED" "$OUT/tests.txt" | tail -5
timeout 60 python3 -m quiver.bench.engine.kernel_bench --residual-epilogue --tokens 512,2048,4096,16384 \
  --out "$OUT/residual.json" 2>&1 | tail -10
if [ -n "${BASE:-}" ]; then
  rm -rf /tmp/base && mkdir -p /tmp/base && tar -xf "$BASE" -C /tmp/base
  for tree in base new; do
    dir=$NEW; [ $tree = base ] && dir=/tmp/base
    echo "== engine_bench, tree $tree"
    (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 120 python3 -m quiver.bench.engine_bench \
       --models qwen3-0.6b-bidirectional-mean --skip-hf --iters 30 --ckpt-dir /tmp/ck --out "$OUT/engine-$tree.json" \
       > "$OUT/engine-$tree.txt" 2>&1; echo "rc=$?")
    grep -E "probe|engine latency|engine throughput|graph replay" "$OUT/engine-$tree.txt" | cut -c1-300 | tail -9
  done
fi
