#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
NEW=$PWD HEAD=$PWD/.devrun/head
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider -rA tests/worker/engine/test_graphs_gpu.py tests/worker/engine/test_gpu.py \
  -k "capture or equal_rows or mixed_stream" > "$OUT/tests.txt" 2>&1
echo "tests rc=$? ($SECONDS s)"; grep -E "^(PASSED|FAILED)|passed|failed|Error" "$OUT/tests.txt" | cut -c1-220 | tail -10
echo "== score_bench new ($SECONDS s)"
timeout 190 python3 -m quiver.bench.score_bench "$OUT/score-new.json" --iters 30 --warmup 8 --ckpt-dir /tmp/ck-score > "$OUT/score-new.txt" 2>&1
echo "rc=$? ($SECONDS s)"
grep -vE "Writing|^\s*$" "$OUT/score-new.txt" | grep -E "quiver|transformers|eager|share" | cut -c1-420 | tail -12
echo "== score_bench HEAD ($SECONDS s)"
[ $SECONDS -lt 400 ] && (cd $HEAD && PYTHONPATH=/tmp/site:$HEAD timeout 160 python3 -m quiver.bench.score_bench "$OUT/score-head.json" --iters 30 --warmup 8 --skip-hf --ckpt-dir /tmp/ck-score > "$OUT/score-head.txt" 2>&1; echo "rc=$?")
grep -vE "Writing|^\s*$" "$OUT/score-head.txt" | grep -E "quiver|eager|share" | cut -c1-420 | tail -8
echo "== probe ($SECONDS s)"
[ $SECONDS -lt 470 ] && (timeout $((585 - SECONDS)) python3 .devrun/dense_thread_probe.py > "$OUT/probe.txt" 2>&1; echo "probe rc=$? ($SECONDS s)")
grep -E "^\||^B:|Error|error" "$OUT/probe.txt" | cut -c1-250
echo "end ($SECONDS s)"
