#!/usr/bin/env bash
# call C: the fused gate/up + SwiGLU probe at large token counts; BGE-M3's pool with token graphs;
# a fresh server of each tree in the order new, base, base, new (probe_first: first and steady requests).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
NEW=$PWD
export PYTHONPATH=/tmp/site:$NEW
echo "== swiglu probe"
timeout 150 python3 .devrun/swiglu_probe.py 512,2048,4096,8192,16384 2>&1 | tee "$OUT/swiglu.txt" | grep -v "^  ptr\|^  tma" 
rm -rf /tmp/base && mkdir -p /tmp/base && tar -xf .devrun/base.tar -C /tmp/base
. bench/serve_ready.sh
read -r pplx bge < <(python3 -m quiver.bench.stand_ins --root /tmp/ck --device cuda pplx-embed-0.6b-shape bge-m3-shape 2>/dev/null | tail -n 2 | paste -sd " ")
echo "== BGE-M3 shape start-up (this tree)"
timeout 100 python3 -c "
import logging, sys; logging.basicConfig(level=logging.INFO)
from quiver.worker.engine import load_engine; load_engine(sys.argv[1], device='cuda')" "$bge" 2>&1 | grep -E "captured|start-up took|Error|upload|failed" | cut -c1-300
python3 -c "from quiver.bench.corpus import stdlib_documents; open('/tmp/words.txt','w').write(' '.join(stdlib_documents()))"
i=0
for tree in new base base new; do
  i=$((i + 1))
  dir=$NEW; [ $tree = base ] && dir=/tmp/base
  (cd $dir && PYTHONPATH=/tmp/site:$dir exec python3 -m quiver serve --model "$pplx" --device cuda --port 18180 --broker-metrics-port 0 --worker-metrics-port 19180 > "$OUT/serve-$i-$tree.log" 2>&1) &
  pid=$!
  start=$SECONDS
  healthy_within $pid 18180 200 || { echo "server $tree did not start"; tail -20 "$OUT/serve-$i-$tree.log"; exit 4; }
  echo "== fresh server $i, tree $tree, healthy after $((SECONDS - start)) s"
  grep -o "captured .*pool [^)]*)\|request path warmed.*" "$OUT/serve-$i-$tree.log" | cut -c1-200
  python3 .devrun/probe_first.py 18180 300 /tmp/words.txt | sed -n '1,3p;$p'
  kill -INT $pid; wait $pid
done
