# Sourced by the bench/*.sh scripts that start `quiver serve`: waiting for a server to be ready.

healthy_within() {  # $1: the server's pid, $2: its port, $3: seconds; false as soon as the server has exited
  local end=$((SECONDS + $3))
  while [ $SECONDS -lt "$end" ]; do
    kill -0 "$1" 2>/dev/null || return 1
    "${PY:-python3}" -c "import sys, urllib.request as u; sys.exit(u.urlopen('http://127.0.0.1:$2/health', timeout=2).status != 200)" \
      2>/dev/null && return 0
    sleep 1
  done
  return 1
}

worker_counters() {  # $1: a worker's metrics port; its counters that say what its traffic did, one line
  curl -s "http://127.0.0.1:$1/metrics" \
    | grep -E "^quiver_worker_(graph_(warmups|captures|replays)_total|eager_steps_total|eager_new_shapes_total|eager_warmups_total|busy_seconds_total|chunks_total\{.*outcome=\"ok\"|step_seconds_(count|sum)|queued_steps_total|startup_seconds)" \
    | sed -E 's/^quiver_worker_([a-z_]+)\{[^}]*\} /\1=/' | paste -sd " "
}
