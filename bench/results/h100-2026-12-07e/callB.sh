#!/usr/bin/env bash
# GPU tests touched by the capture helper (attention survey, graph replay), the kernels of a 32 x 512 step,
# engine alone at both shapes.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONPATH=/tmp/site:$PWD
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rA tests/worker/engine/test_attention_gpu.py \
  tests/worker/engine/test_graphs_gpu.py tests/worker/engine/test_gpu.py \
  -k "attention or graphs_gpu or failed_capture or capture_fails or test_graph_replay_equals_eager or mixed_stream" > "$OUT/tests-b.txt" 2>&1
echo "tests rc=$? ($SECONDS s)"; grep -E "passed|failed|FAILED|Error" "$OUT/tests-b.txt" | cut -c1-250 | tail -10
left=90
echo "== profile_kernels 32x512 ($SECONDS s, $left s left)"
[ $left -gt 40 ] && timeout $left python3 -m quiver.bench.engine.profile_kernels --ckpt-dir /tmp/ck --shapes 32x512 --top 14 \
  > "$OUT/profile.txt" 2>&1
grep -vE "INFO|WARNING|Warning" "$OUT/profile.txt" | cut -c1-200 | tail -45
echo "end ($SECONDS s)"
left=$((430 - SECONDS))
echo "== engine_bench ($SECONDS s, $left s left)"
[ $left -gt 60 ] && timeout $left python3 -m quiver.bench.engine_bench --skip-hf --iters 50 --ckpt-dir /tmp/ck \
  --out "$OUT/engine.json" > "$OUT/engine.txt" 2>&1
echo "rc=$? ($SECONDS s)"
grep -E "probe|engine latency|engine throughput|graph replay|captured" "$OUT/engine.txt" | cut -c1-300 | tail -14

echo "end ($SECONDS s)"
