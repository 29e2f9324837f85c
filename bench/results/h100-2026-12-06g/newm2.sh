#!/usr/bin/env bash
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv,noheader
timeout 90 python3 .devrun/gemm_align.py 2>&1 | grep -v -i warn
NEW=$PWD
rm -rf /tmp/base && mkdir -p /tmp/base && tar -xf .devrun/base.tar -C /tmp/base
cp bench/engine/new_token_counts.py /tmp/base/bench/engine/
run() {
  local dir=$NEW; [ "$1" = base ] && dir=/tmp/base
  (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout 150 python3 -m quiver.bench.engine.new_token_counts \
      --steps 60 --requests 0 --passes 4 --models xlmr-large-cls --root /tmp/ckpts --out "$OUT/newm2-$1-$2.json" > "$OUT/newm2-$1-$2.txt" 2>&1)
  echo "== $1 round $2 (${SECONDS}s)"; python3 -c "
import json; r=json.load(open('$OUT/newm2-$1-$2.json'))
for k,v in r.items():
    if k!='device': print(k, {p:(d if p=='attention_choices' else (d['launch_p50_ms'], d['tokens_per_ms'])) for p,d in v.items()})
" || tail -5 "$OUT/newm2-$1-$2.txt"
}
run base 1; run new 1
[ "$SECONDS" -lt 200 ] && run base 2 && run new 2
