#!/usr/bin/env bash
# call B: online tokens per shared step, 4,096 (default) against 1,536, two servers on one GPU, fresh first runs.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; nproc
FLOOR=0 ROUNDS=2 LEVELS=1,4,8,16 CLIENT_REQUESTS=200 OUT=$OUT timeout 570 bash bench/link_ab_gpu.sh \
  s4096:QUIVER_SHARED_STEP_TOKENS=4096 s1536:QUIVER_SHARED_STEP_TOKENS=1536
echo "rc=$?"
