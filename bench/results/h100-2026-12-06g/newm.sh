#!/usr/bin/env bash
# New token counts: the tree before (base) against this one, the same bench module in each, in turn.
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader | tee $OUT/gpu.txt
NEW=$PWD
rm -rf /tmp/base && mkdir -p /tmp/base && tar -xf .devrun/base.tar -C /tmp/base
cp bench/engine/new_token_counts.py /tmp/base/bench/engine/
run() {
  local dir=$NEW; [ "$1" = base ] && dir=/tmp/base
  (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout 240 python3 -m quiver.bench.engine.new_token_counts \
      --steps ${STEPS:-60} --requests 60 --root /tmp/ckpts --out "$OUT/newm-$1-$2.json" > "$OUT/newm-$1-$2.txt" 2>&1)
  echo "== $1 round $2 (${SECONDS}s)"; python3 -c "
import json,sys; r=json.load(open('$OUT/newm-$1-$2.json'))
for k,v in r.items():
    if k!='device': print(k, {p:{m:x for m,x in d.items() if m in ('launch_p50_ms','tokens_per_ms','p50','p99')} for p,d in v.items()})
" || tail -5 "$OUT/newm-$1-$2.txt"
}
run base 1; run new 1
[ "$SECONDS" -lt 330 ] && run base 2
[ "$SECONDS" -lt 420 ] && run new 2
