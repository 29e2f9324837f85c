"""Helpers for benchmarks that start server processes on loopback: a free port, waiting for an answer,
and the CPU time a process has used."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import time


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on at the time of the call."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_http(port: int, path: str, timeout_s: float, process: subprocess.Popen[bytes]) -> None:
    """Returns once `path` on the port answers below 500 (GET for /health, an empty POST otherwise);
    raises if the process exits or nothing answers within timeout_s."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if process.poll() is not None:
            raise RuntimeError(f"the server on port {port} exited with {process.returncode}")
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            connection.request("GET" if path == "/health" else "POST", path, body=b"" if path != "/health" else None)
            if connection.getresponse().status < 500:
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"no answer on port {port} within {timeout_s} s")


def cpu_seconds(pid: int) -> float:
    """CPU time every thread of a process has run so far (/proc schedstat, in ns: finer than the clock
    ticks of /proc stat, which matters over a few hundred requests)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            total += int(open(f"/proc/{pid}/task/{task}/schedstat").read().split()[0])
        except OSError:
            continue  # the thread ended
    return total / 1e9
