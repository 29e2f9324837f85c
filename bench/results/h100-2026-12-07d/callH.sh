#!/usr/bin/env bash
# The 2,048-token length class: varlen attention at the scoring shapes with the old and new bounds
# (both head shapes), then score_bench on the tree before (BASE tar) and this tree in turn.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
NEW=$PWD
export PYTHONPATH=/tmp/site:$NEW
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rA tests/worker/engine/test_gpu.py \
  -k "2048_length_class or test_graph_replay_equals_eager or mixed_stream" > "$OUT/tests-h.txt" 2>&1
echo "tests rc=$?"; grep -E "passed|failed|FAILED|graphs; replay" "$OUT/tests-h.txt" | tail -8
for heads in xlmr qwen3; do
  echo "== varlen_bound --heads $heads"
  timeout 60 python3 -m quiver.bench.engine.varlen_bound --heads $heads --json "$OUT/varlen-$heads.json" 2>&1 | tee "$OUT/varlen-$heads.txt" | grep "^|"
done
rm -rf /tmp/base && mkdir -p /tmp/base && tar -xf "$BASE" -C /tmp/base
i=0
for tree in ${ORDER:-new base base new}; do
  i=$((i + 1))
  dir=$NEW; [ $tree = base ] && dir=/tmp/base
  extra=--skip-hf; [ $i = 4 ] && extra=
  echo "== $i: score_bench, tree $tree $extra ($SECONDS s)"
  (cd $dir && PYTHONPATH=/tmp/site:$dir timeout 150 python3 -m quiver.bench.score_bench "$OUT/score-$i-$tree.json" \
     --iters 30 --warmup 8 --ckpt-dir /tmp/ck-score $extra > "$OUT/score-$i-$tree.txt" 2>&1; echo "rc=$?")
  grep -E "quiver, |transformers|agree|max_abs" "$OUT/score-$i-$tree.txt" | cut -c1-260
  grep -hE "captured [0-9]+ CUDA graphs|startup|ready in" "$OUT/score-$i-$tree.serve.log" | cut -c1-220 | head -3
done
echo "done ($SECONDS s)"
