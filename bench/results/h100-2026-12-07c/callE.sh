#!/usr/bin/env bash
# call E: the SwiGLU product's GPU tests (and the tests of what its start-up refactor touched); its kernel
# table; the engine alone on the pplx-embed shape, the tree before (HEAD) then this one.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
NEW=$PWD
export PYTHONPATH=/tmp/site:$NEW
timeout 210 python3 -m pytest -q -m gpu -p no:cacheprovider -rA tests/worker/engine/test_swiglu_product.py \
  tests/worker/engine/test_gelu_epilogue.py "tests/worker/engine/test_gpu.py::test_graph_replay_equals_eager" \
  "tests/worker/engine/test_gpu.py::test_fp8_graph_replay_equals_eager" \
  "tests/worker/engine/test_gpu.py::test_bf16_matches_float32_reference_at_real_shapes" -o log_cli=true -o log_cli_level=INFO \
  > "$OUT/tests.txt" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|SwiGLU product|FAILED|Error" "$OUT/tests.txt" | cut -c1-260 | tail -25
timeout 60 python3 -m quiver.bench.engine.kernel_bench --swiglu-product --tokens 512,1024,2048,4096,16384 --out "$OUT/kernel.json" 2>&1 | tail -9
rm -rf /tmp/base && mkdir -p /tmp/base && tar -xf .devrun/head.tar -C /tmp/base
for tree in base new; do
  dir=$NEW; [ $tree = base ] && dir=/tmp/base
  echo "== engine_bench, tree $tree"
  (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 130 python3 -m quiver.bench.engine_bench --models qwen3-0.6b-bidirectional-mean \
     --skip-hf --iters 30 --ckpt-dir /tmp/ck --out "$OUT/engine-$tree.json" > "$OUT/engine-$tree.txt" 2>&1; echo "rc=$?")
  grep -E "SwiGLU product|engine latency|engine throughput|graph replay" "$OUT/engine-$tree.txt" | cut -c1-300 | tail -8
done
