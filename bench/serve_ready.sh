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
