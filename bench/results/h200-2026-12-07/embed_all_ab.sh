#!/usr/bin/env bash
# The 442-token /embed_all A/B again, with the servers' ports and the order of the rounds swapped against
# bench/results/token-graphs-2026-12-07/sparse_ab.sh: the tree before token-row graphs (BASE, a `git archive`
# tar of 94fd652) on 18401 and this tree on 18400, both served at once on one GPU, measured new, base, base,
# new, new, base with client400.py (one 400-word text, 442 tokens: /embed_sparse and /embed_all, 80 requests,
# the first 20 untimed; p50 / p99 ms and the response's bytes). Run from the repository root:
#   git archive 94fd652 -o /tmp/base.tar && BASE=/tmp/base.tar bash bench/results/h200-2026-12-07/embed_all_ab.sh
NEW=$PWD; W=/tmp/sab; mkdir -p $W
rm -rf $W/base && mkdir -p $W/base && tar -xf "${BASE:?a git archive tar of the tree before}" -C $W/base
. bench/serve_ready.sh
ckpt=$(python3 -m quiver.bench.stand_ins --root $W/ckpts --device ${DEV:-cuda} ${STAND_IN_ARGS:-} bge-m3-shape | tail -n 1)
m3=$(python3 -c "from pathlib import Path; import json; from quiver.bench.token_outputs_bench import with_m3_heads; print(with_m3_heads(Path('$ckpt'), Path('$W'), json.load(open('$ckpt/config.json'))['hidden_size']))")
declare -A port=([base]=18401 [new]=18400) mport=([base]=19401 [new]=19400) pid=()
for tree in new base; do
  dir=$NEW; [ $tree = base ] && dir=$W/base
  (cd $dir && PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$dir exec python3 -m quiver serve --model $m3 --device ${DEV:-cuda} \
     --port ${port[$tree]} --gpu-memory-fraction 0.42 --broker-metrics-port 0 --worker-metrics-port ${mport[$tree]} \
     > $W/serve-$tree.log 2>&1) &
  pid[$tree]=$!
done
for tree in base new; do healthy_within ${pid[$tree]} ${port[$tree]} 300 || { echo "$tree not ready"; tail -5 $W/serve-$tree.log; }; done
echo "servers up at ${SECONDS}s"; grep -h "start-up took\|captured" $W/serve-*.log | cut -c1-300
for tree in new base base new new base; do python3 bench/results/h200-2026-12-07/client400.py ${port[$tree]} $tree; done
for tree in new base; do
  echo "$tree: $(curl -s localhost:${mport[$tree]}/metrics | grep -E '^quiver_worker_(eager_steps_total|graph_replays_total|graph_captures_total|graphs|startup_seconds)' | sed -E 's/\{[^}]*\}//' | paste -sd ' ')"
done
kill -TERM ${pid[base]} ${pid[new]}; wait
