#!/usr/bin/env bash
# One device call: the engine alone and scoring, this tree against an earlier one, in turn on one GPU.
#
# With BASE (a tar file of the earlier tree: `git archive REV -o FILE`): engine_bench at batch 1 of each of
# LENGTHS tokens (lengths off a graph bucket's run the ragged graph of the bucket above) and its throughput,
# for MODELS, then score_bench (the reranker shape, 1 query x 5 / 25 / 50 documents; transformers left out)
# through a fresh `quiver serve` of each tree; the trees alternate, this one first. SCORE_ROUNDS=2 runs the
# scoring a second time in the reverse order, so a host's drift falls on both alike. A run that would not
# finish before DEADLINE seconds is left out. Each tree runs its own benchmark code, except that an earlier
# engine_bench.py without --lengths is replaced by this tree's. Writes engine-ab.txt (the tables, the start-up
# survey of the attention backends) and the JSON files and server logs to $OUT.
#
#   OUT=$OUT BASE=.base.tar bash bench/engine_ab_gpu.sh
#   OUT=$OUT BASE=.base.tar MODELS=qwen3-0.6b-bidirectional-mean LENGTHS=500,4000 SCORE_ROUNDS=0 bash bench/engine_ab_gpu.sh
#   OUT=$OUT BASE=.base.tar MODELS= SCORE_ROUNDS=2 bash bench/engine_ab_gpu.sh   (scoring alone)
#   DEVICE=cpu LAYERS=2 LENGTHS=16,100 MAX_LENGTH=128 ITERS=2 BASE=.base.tar bash bench/engine_ab_gpu.sh   (a CPU try)
set -uo pipefail
cd "$(dirname "$0")/.."
NEW=$PWD
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$NEW" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
OUT=${OUT:-bench/out/engine-ab}
WORK=${WORK:-/tmp/quiver-engine-ab}
MODELS=${MODELS-qwen3-0.6b-bidirectional-mean}  # MODELS= (empty) leaves the engine alone out
LENGTHS=${LENGTHS:-128,500,512,1000,4000,4096}
ITERS=${ITERS:-30}
SCORE_ROUNDS=${SCORE_ROUNDS:-1}
DEVICE=${DEVICE:-cuda}
LAYERS=${LAYERS:-0}  # 0: the real layer count
MAX_LENGTH=${MAX_LENGTH:-4096}  # engine_bench leaves out lengths and throughput runs above it
DEADLINE=${DEADLINE:-560}
: "${BASE:?BASE must name a tar file of the earlier tree (git archive REV -o FILE)}"
mkdir -p "$OUT" "$WORK"
log="$OUT/engine-ab.txt"
say() { echo "$*" | tee -a "$log"; }
rm -rf "$WORK/base" && mkdir -p "$WORK/base" && tar -xf "$BASE" -C "$WORK/base"
grep -q -- "--lengths" "$WORK/base/bench/engine_bench.py" || cp bench/engine_bench.py "$WORK/base/bench/engine_bench.py"
tree_dir() { if [ "$1" = base ]; then echo "$WORK/base"; else echo "$NEW"; fi; }
# in_tree TREE SECONDS CMD...: CMD in that tree, with that tree first on PYTHONPATH, for at most SECONDS.
in_tree() {
  local dir; dir=$(tree_dir "$1")
  (cd "$dir" && PYTHONPATH="${PYTHONPATH/$NEW/$dir}" timeout "$2" "${@:3}")
}
say "## $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null || echo no GPU); models $MODELS; lengths $LENGTHS"
engine_trees=(new base)
[ -n "$MODELS" ] || engine_trees=()
for tree in "${engine_trees[@]}"; do
  left=$((DEADLINE - SECONDS))
  if [ "$left" -lt 90 ]; then say "## engine_bench, $tree tree: left out, ${SECONDS} s gone"; continue; fi
  say "## engine_bench, $tree tree (${SECONDS} s)"
  in_tree "$tree" "$left" python3 -m quiver.bench.engine_bench --skip-hf --iters "$ITERS" --ckpt-dir "$WORK/ckpt" \
    --device "$DEVICE" --layers "$LAYERS" --max-length "$MAX_LENGTH" --models "$MODELS" --lengths "$LENGTHS" --out "$OUT/engine-$tree.json" > "$OUT/engine-$tree.log" 2>&1
  grep -E "^\|" "$OUT/engine-$tree.log" | tee -a "$log"
  [ "$tree" = new ] && grep -E "engine:? attention \(" "$OUT/engine-$tree.log" | sed -E "s/.*engine:? //" | cut -c1-200 | tee -a "$log"
done
orders=()
for round in $(seq "$SCORE_ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then orders+=(new base); else orders+=(base new); fi
done
run=0
for tree in "${orders[@]}"; do
  run=$((run + 1)); left=$((DEADLINE - SECONDS))
  if [ "$left" -lt 75 ]; then say "## score_bench $run, $tree tree: left out, ${SECONDS} s gone"; continue; fi
  say "## score_bench $run, $tree tree (${SECONDS} s)"
  in_tree "$tree" "$left" python3 -m quiver.bench.score_bench "$OUT/score-$run-$tree.json" --iters "$ITERS" --warmup 8 \
    --skip-hf --device "$DEVICE" --layers "$LAYERS" --ckpt-dir "$WORK/ckpt-score" > "$OUT/score-$run-$tree.log" 2>&1
  grep -E "^\| (runner|quiver)" "$OUT/score-$run-$tree.log" | tee -a "$log"
  grep -E "documents:" "$OUT/score-$run-$tree.log" | grep quiver | sed -E "s/'p90[^}]*\}//g" | cut -c1-240 | tee -a "$log"
  [ "$run" = 1 ] && grep -E "engine:? attention \(" "$OUT/score-$run-$tree.serve.log" | sed -E "s/.*engine:? //" | cut -c1-200 | tee -a "$log"
done
say "done after ${SECONDS} s"
