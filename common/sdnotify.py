"""systemd's service notification protocol, spoken directly (no libsystemd).

A unit with Type=notify starts the process with NOTIFY_SOCKET set: the path of a datagram socket,
or, starting with '@', the name of one in the abstract namespace. Each notification is one datagram
of newline-separated KEY=VALUE lines: READY=1 once the service is ready, STOPPING=1 when it begins
to stop, STATUS=... for `systemctl status`, and WATCHDOG=1 at least every WatchdogSec, which systemd
passes as WATCHDOG_USEC (for the process WATCHDOG_PID, when set). Outside systemd nothing is set
and every call here does nothing. See sd_notify(3).
"""

from __future__ import annotations

import logging
import os
import socket
import time

log = logging.getLogger("quiver.sdnotify")

_warned = False


def _address() -> str | None:
    path = os.environ.get("NOTIFY_SOCKET", "")
    if path.startswith("@"):
        return "\0" + path[1:]
    if path.startswith("/"):
        return path
    return None  # unset, or a kind of address this module does not speak (vsock)


def notify(*lines: str) -> bool:
    """Send one notification (e.g. "READY=1", "STATUS=serving"); True when it was sent."""
    global _warned
    address = _address()
    if address is None or not lines:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall("\n".join(lines).encode())
        return True
    except OSError as exc:
        if not _warned:
            _warned = True
            log.warning("cannot notify systemd on %s: %s", os.environ.get("NOTIFY_SOCKET"), exc)
        return False


def ready(status: str = "") -> bool:
    return notify("READY=1", *([f"STATUS={status}"] if status else []))


def stopping(status: str = "") -> bool:
    return notify("STOPPING=1", *([f"STATUS={status}"] if status else []))


def status(text: str) -> bool:
    return notify(f"STATUS={text}")


def watchdog_interval_s() -> float | None:
    """WatchdogSec in seconds when systemd asked this process for pings, else None."""
    usec = os.environ.get("WATCHDOG_USEC", "")
    pid = os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and (not pid.isdigit() or int(pid) != os.getpid()):
        return None
    return int(usec) / 1_000_000


class Watchdog:
    """Pets systemd's watchdog from a loop: kick() every iteration sends WATCHDOG=1 at most every
    half WatchdogSec, so a loop that stops iterating is noticed and the service restarted."""

    def __init__(self, timeout_s: float | None) -> None:
        self.period_s = timeout_s / 2 if timeout_s else None
        self.next_at = 0.0
        self.sent = 0

    @classmethod
    def from_environment(cls) -> Watchdog:
        return cls(watchdog_interval_s())

    @property
    def enabled(self) -> bool:
        return self.period_s is not None

    def kick(self) -> None:
        if self.period_s is None:
            return
        now = time.monotonic()
        if now >= self.next_at:
            self.next_at = now + self.period_s
            if notify("WATCHDOG=1"):
                self.sent += 1
