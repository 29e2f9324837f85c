#!/usr/bin/env bash
# Tiles near the default, GPU tests with the default tile, scoring this tree against HEAD (new, head, new).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
NEW=$PWD HEAD=$PWD/.devrun/head
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
echo "== GPU tests ($SECONDS s)"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rA tests/worker/engine/test_triton_attention.py \
  tests/worker/engine/test_attention_gpu.py tests/worker/engine/test_gpu.py \
  -k "triton or attention_gpu or graph_replay_equals_eager or mixed_stream or 2048_length_class or equal_rows_above" > "$OUT/tests.txt" 2>&1
echo "tests rc=$? ($SECONDS s)"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.txt" | cut -c1-250 | tail -12
n=0
for tree in new head; do
  n=$((n+1)); left=$((300 - SECONDS)); [ $left -lt 75 ] && { echo "score $n $tree: left out ($SECONDS s)"; continue; }
  dir=$NEW; [ $tree = head ] && dir=$HEAD
  echo "== score_bench $n $tree ($SECONDS s)"
  (cd $dir && PYTHONPATH=/tmp/site:$dir timeout $left python3 -m quiver.bench.score_bench "$OUT/score$n-$tree.json" --iters 30 --warmup 8 \
     --skip-hf --ckpt-dir /tmp/ck-score > "$OUT/score$n-$tree.txt" 2>&1)
  echo "rc=$? ($SECONDS s)"
  grep -E "^\| quiver" "$OUT/score$n-$tree.txt"; grep -E "documents:" "$OUT/score$n-$tree.txt" | grep quiver | sed -E "s/'p90.*'n': 30\}//; s/worker's eager counts[^:]*://" | cut -c1-240
  [ $n = 1 ] && grep -E "engine: attention \(" "$OUT/score$n-$tree.serve.log" | sed -E "s/.*engine: //" | cut -c1-150 | head -24
done
left=$((340 - SECONDS))
echo "== tiles near the default ($SECONDS s)"
[ $left -gt 30 ] && timeout $left python3 -m quiver.bench.engine.attention_tiles --tiles near-default --json "$OUT/tiles.json" > "$OUT/tiles.txt" 2>&1
echo "rc=$? ($SECONDS s)"; grep -vE "Warning|warn" "$OUT/tiles.txt" | tail -30
echo "end ($SECONDS s)"
cd "$OUT" && tar czf all.tgz --exclude=all.tgz * && find . -type f ! -name all.tgz -delete; ls -la "$OUT"
