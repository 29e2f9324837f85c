#!/usr/bin/env bash
# Verify the dense-step priming: GPU tests, scoring with transformers; on an H200 also concurrency + batch 1.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$gpu"; nproc
echo "== score_bench ($SECONDS s)"
timeout 200 python3 -m quiver.bench.score_bench "$OUT/score.json" --iters 30 --warmup 8 --ckpt-dir /tmp/ck-score > "$OUT/score.txt" 2>&1
echo "rc=$? ($SECONDS s)"
grep -E "^\|" "$OUT/score.txt"; grep -E "documents:" "$OUT/score.txt" | grep quiver | sed -E "s/'p90.*'n': 30\}//; s/worker's eager counts[^:]*://" | cut -c1-300
python3 -c "
import json
d=json.load(open('$OUT/score.json'))
for run in ('quiver','quiver_httpx'):
    for c in ('25','50'):
        s=d[run]['samples_ms'][c]; m=sorted(s)[len(s)//2]; print(run,c,'slow (>1.3 x p50):',[(i,v) for i,v in enumerate(s) if v>1.3*m])
"
grep -hE "set up in|could not be set up|primed|Traceback|dense" "$OUT"/score*.serve.log 2>/dev/null | cut -c1-220 | head -20
ls "$OUT"
echo "== GPU tests ($SECONDS s)"
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider -rA tests/worker/engine/test_graphs_gpu.py tests/worker/engine/test_gpu.py \
  -k "capture or equal_rows or mixed_stream or replay" > "$OUT/tests.txt" 2>&1
echo "tests rc=$? ($SECONDS s)"; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" "$OUT/tests.txt" | cut -c1-200 | tail -16
if [[ "$gpu" == *H200* ]]; then
  echo "== concurrency + batch 1 ($SECONDS s)"
  OUT=$OUT/b1 ROUNDS=1 SHAPES=pplx-embed-0.6b-shape LEVELS=1,4,8,16,64 CLIENT_REQUESTS=200 DEADLINE=330 timeout 340 bash bench/batch1_gpu.sh > "$OUT/b1.txt" 2>&1
  echo "rc=$? ($SECONDS s)"; grep -E "^\||graphs|captur" "$OUT/b1/batch1.txt" | cut -c1-250 | head -40
fi
echo "end ($SECONDS s)"
