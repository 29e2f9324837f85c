#!/usr/bin/env bash
# call 1: a fresh server's first requests in order (the tree before, then this one); a graph's first launch.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; nproc
NEW=$PWD
rm -rf /tmp/base && mkdir -p /tmp/base && tar -xf "${BASE:?a tar of the earlier tree, git archive REV -o FILE}" -C /tmp/base
. bench/serve_ready.sh
export PYTHONPATH=/tmp/site:$NEW
ckpt=$(python3 -m quiver.bench.stand_ins --root /tmp/ck --device cuda pplx-embed-0.6b-shape | tail -n 1)
python3 -c "from quiver.bench.corpus import stdlib_documents; open('/tmp/words.txt','w').write(' '.join(stdlib_documents()))"
for tree in base new; do
  dir=$NEW; [ $tree = base ] && dir=/tmp/base
  (cd $dir && PYTHONPATH=/tmp/site:$dir exec python3 -m quiver serve --model "$ckpt" --device cuda --port 18180 --broker-metrics-port 0 --worker-metrics-port 19180 > "$OUT/serve-$tree.log" 2>&1) &
  pid=$!
  start=$SECONDS
  healthy_within $pid 18180 200 || { echo "server $tree did not start"; tail -20 "$OUT/serve-$tree.log"; exit 4; }
  echo "== fresh server, tree $tree, healthy after $((SECONDS - start)) s"
  grep -o "captured .*pool [^)]*)\|start-up took [0-9.]* s" "$OUT/serve-$tree.log"
  python3 bench/results/h100-2026-12-07b/probe_first.py 18180 120 /tmp/words.txt
  curl -s localhost:19180/metrics | grep -E "^quiver_worker_(graph_replays_total|eager_steps_total|graph_captures_total)" | head
  kill -INT $pid; wait $pid
done
echo "== engine probe (this tree)"
timeout 200 python3 bench/results/h100-2026-12-07b/probe_replay.py "$ckpt" 2>&1 | grep -v "INFO\|WARNING"
