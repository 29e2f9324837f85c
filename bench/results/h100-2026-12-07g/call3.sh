#!/usr/bin/env bash
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
NEW=$PWD HEAD=$PWD/.devrun/head
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 130 python3 -m pytest -q -m gpu -p no:cacheprovider -rA tests/worker/engine/test_graphs_gpu.py tests/worker/engine/test_gpu.py \
  -k "capture or equal_rows or mixed_stream" > "$OUT/tests.txt" 2>&1
echo "tests rc=$? ($SECONDS s)"; grep -E "^(PASSED|FAILED)|passed|failed|Error" "$OUT/tests.txt" | cut -c1-200 | tail -12
samples() { python3 -c "
import json,sys
d=json.load(open('$1'))
for run in ('quiver','quiver_httpx'):
    for c in ('25','50'):
        s=d[run].get('samples_ms',{}).get(c)
        if s: print(run,c,'slow (>1.5 x p50):',[(i,v) for i,v in enumerate(s) if v>1.5*sorted(s)[len(s)//2]])
"; }
echo "== score_bench new ($SECONDS s)"
timeout 200 python3 -m quiver.bench.score_bench "$OUT/score-new.json" --iters 30 --warmup 8 --ckpt-dir /tmp/ck-score > "$OUT/score-new.txt" 2>&1
echo "rc=$? ($SECONDS s)"
grep -E "^\|" "$OUT/score-new.txt"; grep -E "documents:" "$OUT/score-new.txt" | grep quiver | sed -E "s/server stages.*eager counts[^:]*://" | cut -c1-300
samples "$OUT/score-new.json"
grep -hE "set up in|could not be set up|dense_thread|Traceback" "$OUT"/score-new*.serve.log | cut -c1-200 | head -20
echo "== score_bench HEAD ($SECONDS s)"
[ $SECONDS -lt 420 ] && (cd $HEAD && PYTHONPATH=/tmp/site:$HEAD timeout 160 python3 -m quiver.bench.score_bench "$OUT/score-head.json" --iters 30 --warmup 8 --skip-hf --ckpt-dir /tmp/ck-score > "$OUT/score-head.txt" 2>&1; echo "rc=$?")
grep -E "^\|" "$OUT/score-head.txt"; grep -E "documents:" "$OUT/score-head.txt" | grep quiver | sed -E "s/server stages.*eager counts[^:]*://" | cut -c1-300
echo "end ($SECONDS s)"
