#!/usr/bin/env bash
# call A: every GPU test of the repo, with the start-up warnings they log.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader; nproc
timeout 560 python3 -m pytest -q -m gpu tests -p no:cacheprovider --durations=12 -o log_level=WARNING \
  -o log_cli=false > "$OUT/gputests.txt" 2>&1
echo "rc=$?"
tail -40 "$OUT/gputests.txt"
grep -ci "fusion failed" "$OUT/gputests.txt"
