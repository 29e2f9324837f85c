#!/usr/bin/env bash
# The capture helper's GPU tests with the pool released and the tests it touches; then what an eager step
# above the graphs costs at first sight of its shape (.devrun/first_sight.py), as device time allows.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONPATH=/tmp/site:$PWD
timeout 80 python3 -m pytest -q -m gpu -p no:cacheprovider -rA tests/worker/engine/test_graphs_gpu.py \
  tests/worker/engine/test_attention_gpu.py tests/worker/engine/test_gpu.py \
  -k "attention or failed_capture or capture_fails or test_graph_replay_equals_eager or mixed_stream" > "$OUT/tests-c.txt" 2>&1
echo "tests rc=$? ($SECONDS s)"; grep -E "^(PASSED|FAILED)|passed|failed|Error" "$OUT/tests-c.txt" | cut -c1-200 | tail -16
echo "== first sight ($SECONDS s)"
[ $SECONDS -lt 100 ] && timeout $((${CALL_S:-200} - SECONDS)) python3 .devrun/first_sight.py 2>&1 | grep -E "^\||Error|error" | cut -c1-160
echo "end ($SECONDS s)"
