#!/usr/bin/env bash
# The Triton attention kernel: tiles against FA2 and cuDNN, GPU tests, then the engine alone, this tree against HEAD.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
NEW=$PWD HEAD=$PWD/.devrun/head
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; python3 -c "import triton; print('triton', triton.__version__)"
echo "== tiles ($SECONDS s)"
timeout 200 python3 -m quiver.bench.engine.attention_tiles --json "$OUT/tiles.json" > "$OUT/tiles.txt" 2>&1
echo "rc=$? ($SECONDS s)"; grep -vE "Warning|warn" "$OUT/tiles.txt" | tail -32
echo "== GPU tests ($SECONDS s)"
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rA tests/worker/engine/test_triton_attention.py \
  tests/worker/engine/test_attention_gpu.py > "$OUT/tests.txt" 2>&1
echo "tests rc=$? ($SECONDS s)"; grep -E "^(FAILED|ERROR)|passed|failed|Error" "$OUT/tests.txt" | cut -c1-250 | tail -12
for tree in new head; do
  left=$((520 - SECONDS)); [ $left -lt 90 ] && { echo "engine $tree: left out ($SECONDS s)"; continue; }
  dir=$NEW; [ $tree = head ] && dir=$HEAD
  echo "== engine_bench $tree ($SECONDS s)"
  (cd $dir && PYTHONPATH=/tmp/site:$dir timeout $left python3 -m quiver.bench.engine_bench --skip-hf --iters 30 --ckpt-dir /tmp/ck \
    --models qwen3-0.6b-bidirectional-mean --out "$OUT/engine-$tree.json" > "$OUT/engine-$tree.txt" 2>&1)
  echo "rc=$? ($SECONDS s)"
  grep -E "engine latency|engine throughput|graph replay" "$OUT/engine-$tree.txt" | cut -c1-300 | tail -8
  [ $tree = new ] && grep -E "engine: attention \(" "$OUT/engine-$tree.txt" | sed -E "s/.*engine: //" | cut -c1-160 | head -24
done
echo "end ($SECONDS s)"
