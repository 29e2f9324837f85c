#!/usr/bin/env bash
# cuDNN's ragged attention as a backend: GPU tests (every kept backend against float32 and replayed on other
# lengths; engine graph replay against eager), varlen_bound at graph shapes (both head shapes), then the
# pplx-embed shape's concurrency with it allowed and excluded, two fresh servers of this tree on one GPU.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
export PYTHONPATH=/tmp/site:$PWD
python3 -c "import torch; print(torch.__version__, torch.backends.cudnn.version())"
timeout 140 python3 -m pytest -q -m gpu -p no:cacheprovider -rA -s tests/worker/engine/test_attention_gpu.py \
  tests/worker/engine/test_swiglu_product.py tests/worker/engine/test_gpu.py \
  -k "attention or swiglu or 2048_length_class or test_graph_replay_equals_eager or mixed_stream" > "$OUT/tests-i.txt" 2>&1
echo "tests rc=$? ($SECONDS s)"; grep -E "passed|failed|FAILED|Error|replayed on other|graphs; replay" "$OUT/tests-i.txt" | cut -c1-300 | tail -16
for heads in; do
  echo "== varlen_bound --heads $heads ($SECONDS s)"
  timeout 60 python3 -m quiver.bench.engine.varlen_bound --heads $heads --json "$OUT/varlen-$heads.json" > "$OUT/varlen-$heads.txt" 2>&1
  echo "rc=$?"; grep -E "^\||Error|error" "$OUT/varlen-$heads.txt" | cut -c1-400
done
echo "done ($SECONDS s)"
