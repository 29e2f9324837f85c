#!/usr/bin/env bash
# Bulk jobs on a GPU: `quiver embed` beside the bulk benchmark's client, and the online p99 with and
# without a Batch API job running, on one `quiver serve` of a stand-in (bench/stand_ins.py).
#
#   bash bench/bulk_jobs_gpu.sh [STAND_IN]        (default pplx-embed-0.6b-shape)
#   environment: OUT (default bench/out/bulk-gpu), SERVE_ARGS (more `quiver serve` options), BULK_ARGS (more
#       bench/bulk_jobs.py options), DEVICE=cpu STAND_IN_ARGS=--small to try the script on a CPU.
#
# Writes into $OUT: bulk-jobs.json (the bench's results), bulk-jobs-log.txt (this script's output and the
# server's log). Run from a source tree that is not installed (as on the device machine), the tree's
# entry points (`quiver embed`, the Batch API routes) are registered for this run under $WORK.
set -uo pipefail
cd "$(dirname "$0")/.."
WORK=${WORK:-/tmp/quiver-bulk}
mkdir -p "$WORK"
export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}:$PWD" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
OUT=${OUT:-bench/out/bulk-gpu}
PORT=${PORT:-18090}
DEVICE=${DEVICE:-cuda}
name=${1:-pplx-embed-0.6b-shape}
mkdir -p "$OUT"
log="$OUT/bulk-jobs-log.txt"

if ! $PY -c "from importlib.metadata import entry_points as e; import sys; sys.exit(not e(group='quiver.commands', name='embed'))"; then
  info="$WORK/site/quiver_source_tree-0.dist-info"
  mkdir -p "$info"
  printf 'Metadata-Version: 2.1\nName: quiver-source-tree\nVersion: 0\n' > "$info/METADATA"
  sed -n '/^\[options.entry_points\]/,/^\[/p' setup.cfg | sed '1d;$d' \
    | sed -E 's/^([a-z_.]+) =$/[\1]/; s/^    //' > "$info/entry_points.txt"
  echo "registered the source tree's entry points in $info" | tee -a "$log"
fi

started=$SECONDS
# shellcheck disable=SC2086  # STAND_IN_ARGS, SERVE_ARGS and BULK_ARGS are word lists
ckpt=$($PY -m quiver.bench.stand_ins --root "$WORK/ckpts" --device "$DEVICE" ${STAND_IN_ARGS:-} "$name" 2>>"$log" | tail -n 1)
[ -d "$ckpt" ] || { echo "bulk_jobs_gpu.sh: no checkpoint for $name" | tee -a "$log"; exit 1; }
rm -rf "$WORK/data"
# shellcheck disable=SC2086
$PY -m quiver serve --model "$ckpt" --device "$DEVICE" --port "$PORT" --data-dir "$WORK/data" ${SERVE_ARGS:-} \
  > "$WORK/serve.log" 2>&1 &
server=$!
status=1
# shellcheck source=bench/serve_ready.sh
. bench/serve_ready.sh
if healthy_within "$server" "$PORT" 420; then
  echo "server up after $((SECONDS - started)) s" | tee -a "$log"
  # shellcheck disable=SC2086
  $PY -m quiver.bench.bulk_jobs --url "http://127.0.0.1:$PORT" --model "$ckpt" --out "$WORK/bench" ${BULK_ARGS:-} 2>&1 \
    | tee -a "$log"
  status=${PIPESTATUS[0]}
  cp "$WORK/bench/results.json" "$OUT/bulk-jobs.json" 2>/dev/null
fi
kill -TERM "$server" 2>/dev/null
wait "$server"
{ echo "----- serve log (end)"; tail -n 60 "$WORK/serve.log"; } >> "$log"
echo "done in $((SECONDS - started)) s, status $status" | tee -a "$log"
exit "$status"
