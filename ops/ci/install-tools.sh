#!/usr/bin/env bash
# Installs the tools the ops tests use: Prometheus with promtool (Debian package `prometheus`) and
# systemd-analyze (Debian package `systemd`). Idempotent and quiet; with no root, no apt-get or no
# network it prints one line and exits 0, and the tests that need a missing tool skip saying why.
set -u

need=()
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v systemd-analyze >/dev/null 2>&1 || need+=(systemd)
[ ${#need[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "ops/ci/install-tools.sh: not root or no apt-get; not installing ${need[*]} (those ops tests skip)"
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
log="$(mktemp -t quiver-install-tools.XXXXXX)"
# Keep the packages' services from being started here (no init system in CI; nothing should run).
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
fi
ok=0
for attempt in 1 2; do
    if timeout 300 apt-get -y -q -o Dpkg::Use-Pty=0 install --no-install-recommends "${need[@]}" >>"$log" 2>&1; then
        ok=1
        break
    fi
    timeout 300 apt-get -q update >>"$log" 2>&1 || break
done
[ "$made_policy" -eq 1 ] && rm -f "$policy"
if [ "$ok" -eq 1 ]; then
    rm -f "$log"
else
    echo "ops/ci/install-tools.sh: could not install ${need[*]} (see $log); those ops tests skip"
fi
exit 0
