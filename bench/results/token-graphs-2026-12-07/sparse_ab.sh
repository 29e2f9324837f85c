#!/usr/bin/env bash
# Whole server, the BGE-M3 stand-in with its two heads: batch-1 /embed, /embed_sparse and /embed_all of one
# text at three lengths (35, 132 and 442 tokens), the tree before token-row graphs (BASE, a `git archive`
# tar of 94fd652) and this one, both served at once on one GPU. Run from the repository root:
#   git archive 94fd652 -o /tmp/base.tar && BASE=/tmp/base.tar bash bench/results/token-graphs-2026-12-07/sparse_ab.sh
# (DEV=cpu STAND_IN_ARGS=--small for a try on a CPU.) FIRST (base or new) is the tree started first and
# served on the lower ports, ORDER the trees measured in turn, CLIENT_ARGS more options of sparse_client.py.
NEW=$PWD; HERE=$(cd "$(dirname "$0")" && pwd); W=/tmp/sab; mkdir -p $W
rm -rf $W/base && mkdir -p $W/base && tar -xf "${BASE:?a git archive tar of the tree before}" -C $W/base
. bench/serve_ready.sh
ckpt=$(python3 -m quiver.bench.stand_ins --root $W/ckpts --device ${DEV:-cuda} ${STAND_IN_ARGS:-} bge-m3-shape | tail -n 1)
m3=$(python3 -c "from pathlib import Path; import json; from quiver.bench.token_outputs_bench import with_m3_heads; print(with_m3_heads(Path('$ckpt'), Path('$W'), json.load(open('$ckpt/config.json'))['hidden_size']))")
FIRST=${FIRST:-base}; SECOND=new; [ "$FIRST" = new ] && SECOND=base
declare -A port=([$FIRST]=18400 [$SECOND]=18401) mport=([$FIRST]=19400 [$SECOND]=19401) pid=()
for tree in $FIRST $SECOND; do
  dir=$NEW; [ $tree = base ] && dir=$W/base
  (cd $dir && PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$dir exec python3 -m quiver serve --model $m3 --device ${DEV:-cuda} \
     --port ${port[$tree]} --gpu-memory-fraction 0.42 --broker-metrics-port 0 --worker-metrics-port ${mport[$tree]} \
     > $W/serve-$tree.log 2>&1) &
  pid[$tree]=$!
done
for tree in base new; do healthy_within ${pid[$tree]} ${port[$tree]} 300 || { echo "$tree not ready"; tail -5 $W/serve-$tree.log; }; done
echo "servers up at ${SECONDS}s"; grep -h "start-up took\|captured" $W/serve-*.log | cut -c1-300
# shellcheck disable=SC2086  # ORDER and CLIENT_ARGS are word lists
for tree in ${ORDER:-base new new base}; do python3 "$HERE/sparse_client.py" ${port[$tree]} $tree ${CLIENT_ARGS:-}; done
for tree in base new; do
  echo "$tree: $(curl -s localhost:${mport[$tree]}/metrics | grep -E '^quiver_worker_(eager_steps_total|graph_replays_total|graph_captures_total|graphs|startup_seconds)' | sed -E 's/\{[^}]*\}//' | paste -sd ' ')"
done
kill -TERM ${pid[base]} ${pid[new]}; wait
