#!/usr/bin/env bash
# The issues' aims on this tree: capture-failure probe, batch 1 + concurrency (pplx shape), scoring with
# transformers, engine alone at both shapes.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; nproc
NEW=$PWD
export PYTHONPATH=/tmp/site:$NEW
for mode in none fresh clone seed; do timeout 40 python3 .devrun/capture_probe.py $mode 2>&1 | grep -v Warning | tail -6; done
timeout 90 python3 -m pytest -q -m gpu -p no:cacheprovider -rA tests/worker/engine/test_graphs_gpu.py > "$OUT/tests-graphs.txt" 2>&1
echo "graph tests rc=$?"; grep -E "passed|failed|FAILED|Error" "$OUT/tests-graphs.txt" | cut -c1-250 | tail -8
echo "== batch1 ($SECONDS s)"
ROUNDS=1 SHAPES=pplx-embed-0.6b-shape LEVELS=1,4,8,16,64 CLIENT_REQUESTS=200 DEADLINE=250 OUT=$OUT/b1 \
  timeout 260 bash bench/batch1_gpu.sh > "$OUT/batch1.out" 2>&1
echo "rc=$? ($SECONDS s)"
grep -E "^\||^#|startup_seconds" "$OUT/b1/batch1.txt" | grep -vE "^\| [0-9]+ /|^\| --- " | cut -c1-240 | head -60
grep -hE "captured [0-9]+ CUDA graphs|start-up took" /tmp/quiver-batch1/serve-*.log | cut -c1-240 | head -4
echo "== score_bench ($SECONDS s)"
timeout 170 python3 -m quiver.bench.score_bench "$OUT/score.json" --iters 30 --warmup 8 --ckpt-dir /tmp/ck-score > "$OUT/score.txt" 2>&1
echo "rc=$? ($SECONDS s)"
grep -E "quiver, |transformers|agree|max_abs|share" "$OUT/score.txt" | cut -c1-260
grep -hE "captured [0-9]+ CUDA graphs|start-up took" "$OUT"/score*.serve.log | cut -c1-220 | head -3
echo "end ($SECONDS s)"
