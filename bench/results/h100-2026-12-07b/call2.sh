#!/usr/bin/env bash
# call 2: a fresh server's first requests (the tree before, then this one: warm-up, upload, capture order);
# the engine's first steps with the upload; BGE-M3's pool.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
NEW=$PWD
rm -rf /tmp/base && mkdir -p /tmp/base && tar -xf "${BASE:?a tar of the earlier tree, git archive REV -o FILE}" -C /tmp/base
. bench/serve_ready.sh
export PYTHONPATH=/tmp/site:$NEW
read -r pplx bge < <(python3 -m quiver.bench.stand_ins --root /tmp/ck --device cuda pplx-embed-0.6b-shape bge-m3-shape 2>/dev/null | tail -n 2 | paste -sd " ")
python3 -c "from quiver.bench.corpus import stdlib_documents; open('/tmp/words.txt','w').write(' '.join(stdlib_documents()))"
for tree in ${TREES:-base new}; do
  dir=$NEW; [ $tree = base ] && dir=/tmp/base
  (cd $dir && PYTHONPATH=/tmp/site:$dir exec python3 -m quiver serve --model "$pplx" --device cuda --port 18180 --broker-metrics-port 0 --worker-metrics-port 19180 > "$OUT/serve-$tree.log" 2>&1) &
  pid=$!
  start=$SECONDS
  healthy_within $pid 18180 200 || { echo "server $tree did not start"; tail -20 "$OUT/serve-$tree.log"; exit 4; }
  echo "== fresh server, tree $tree, healthy after $((SECONDS - start)) s"
  grep -o "captured .*pool [^)]*)\|start-up took [0-9.]* s\|request path warmed.*" "$OUT/serve-$tree.log"
  python3 bench/results/h100-2026-12-07b/probe_first.py 18180 120 /tmp/words.txt
  kill -INT $pid; wait $pid
done
echo "== engine probe, pplx-embed shape (this tree)"
timeout 150 python3 bench/results/h100-2026-12-07b/probe_replay.py "$pplx" 2>&1 | grep -E "captured|start-up took|^\[|engine.step|a graph|Error|error|upload" | cut -c1-300
echo "== BGE-M3 shape start-up (this tree)"
timeout 100 python3 -c "
import logging, sys; logging.basicConfig(level=logging.INFO)
from quiver.worker.engine import load_engine; load_engine(sys.argv[1], device='cuda')" "$bge" 2>&1 | grep -E "captured|start-up took|Error|upload" | cut -c1-300
