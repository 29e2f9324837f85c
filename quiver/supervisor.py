"""`quiver serve`: broker, workers and frontend as child processes of one supervisor.

Start-up is checked: each child tells the supervisor it is ready (READY=1 on a private notification
socket, the protocol systemd speaks, common/sdnotify.py). A child that exits before it is ready ends
`serve` with that child's last error line and a non-zero status (78 when the model cannot be used),
instead of being started again. After start-up, a child that dies is started again with a backoff,
except one that exits 78 (its model cannot be loaded; restarting will not help), which stops `serve`.
SIGINT/SIGTERM stop the frontend first, then let the workers drain, then stop the broker.
Children run in their own session (so a terminal's Ctrl-C reaches only the supervisor, which orders
the shutdown) and are sent SIGTERM by the kernel if the supervisor itself dies. Their stderr passes
through the supervisor, which keeps the last lines of each to say why one failed.
"""

from __future__ import annotations

import collections
import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import IO

from quiver.common import sdnotify
from quiver.common.config import ServeSettings
from quiver.common.model_info import EXIT_MODEL_ERROR, ModelError, load_model_info, resolve_model_dir
from quiver.common.models_file import ModelEntry
from quiver.plan import ChildSpec, ServeError, check_device_syntax, plan_children, visible_gpus

log = logging.getLogger("quiver.serve")

STOP_TIMEOUT_S = 30.0
MAX_BACKOFF_S = 30.0
STABLE_AFTER_S = 60.0
PR_SET_PDEATHSIG = 1
TAIL_LINES = 30


def _die_with_parent() -> None:
    """Run in each child before exec: SIGTERM it when the supervisor goes away."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def _forward(stream: IO[bytes], tail: collections.deque[str]) -> None:
    """Copy a child's stderr to ours line by line, keeping the last lines."""
    out = sys.stderr.buffer
    for line in stream:
        out.write(line)
        out.flush()
        tail.append(line.decode(errors="replace").rstrip())
    stream.close()


class Child:
    """One supervised process, with its own readiness socket."""

    def __init__(self, spec: ChildSpec, notify_path: Path) -> None:
        self.spec = spec
        self.name = spec.name
        self.process: subprocess.Popen | None = None
        self.started = 0.0
        self.restarts = 0
        self.next_start = 0.0
        self.backoff = 1.0
        self.ready = False
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.forwarder: threading.Thread | None = None
        self.notify_path = notify_path
        self.notifications = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.notifications.bind(str(notify_path))
        self.notifications.setblocking(False)

    def start(self) -> None:
        self.ready = False
        env = {**self.spec.env, "NOTIFY_SOCKET": str(self.notify_path)}
        self.process = subprocess.Popen(self.spec.argv, env=env, stderr=subprocess.PIPE, start_new_session=True,
                                        preexec_fn=_die_with_parent)
        assert self.process.stderr is not None
        self.forwarder = threading.Thread(target=_forward, args=(self.process.stderr, self.tail), daemon=True,
                                          name=f"stderr of {self.name}")
        self.forwarder.start()
        self.started = time.monotonic()
        log.info("started %s (pid %d)", self.name, self.process.pid)

    def read_notifications(self) -> None:
        while True:
            try:
                message = self.notifications.recv(4096)
            except BlockingIOError:
                return
            if b"READY=1" in message.split(b"\n"):
                self.ready = True

    def reason(self) -> str:
        """The child's last error line, else its last line, for the one-line account of a failure."""
        if self.forwarder is not None:
            self.forwarder.join(1.0)  # its last lines may still be in the pipe
        lines = [line for line in self.tail if line.strip()]
        errors = [line for line in lines if "ERROR" in line or "Error" in line or "error" in line]
        return (errors or lines or ["(it printed nothing)"])[-1].strip()

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signum)

    def wait_exit(self, seconds: float) -> int | None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            code = self.exit_code()
            if code is not None:
                return code
            time.sleep(0.05)
        return None


class Supervisor:
    def __init__(self, settings: ServeSettings, models: list[ModelEntry] | None = None) -> None:
        self.settings = settings
        self.models = models or [ModelEntry(settings.model, settings.served_model_name)]
        self.stop_requested = False
        self.children: list[Child] = []
        self.runtime_dir: Path | None = None

    def _request_stop(self, signum: int, _frame: object) -> None:
        log.info("%s: shutting down", signal.Signals(signum).name)
        self.stop_requested = True

    def _plan(self) -> list[ChildSpec]:
        s = self.settings
        check_device_syntax(s.device)
        for entry in self.models:
            check_device_syntax(entry.device)
        models = [replace(entry, model=str(resolve_model_dir(entry.model))) for entry in self.models]
        infos = [load_model_info(entry.model) for entry in models]
        devices = {entry.device or s.device for entry in models}
        gpus = visible_gpus() if devices != {"cpu"} else 0
        base = os.environ.get("XDG_RUNTIME_DIR")
        self.runtime_dir = Path(tempfile.mkdtemp(prefix="quiver-serve-", dir=base if base and os.access(base, os.W_OK)
                                                 else None))  # mode 0700: the broker's sockets are ours alone
        specs = plan_children(s, Path(models[0].model), self.runtime_dir, gpus, models)
        for entry, info in zip(models, infos):
            workers = [spec for spec in specs if spec.role == "worker"
                       and spec.argv[spec.argv.index("--model") + 1] == entry.model]
            log.info("serving %s (%s) from %s with %d worker(s) on %s", info.name, info.kind, entry.model,
                     len(workers), ", ".join(sorted({spec.argv[spec.argv.index("--device") + 1] for spec in workers})))
        return specs

    def run(self) -> int:
        try:
            try:
                specs = self._plan()
            except ServeError as exc:
                log.error("cannot serve: %s", exc)
                return exc.exit_code
            except ModelError as exc:
                log.error("cannot serve: %s", exc)
                return EXIT_MODEL_ERROR
            assert self.runtime_dir is not None
            self.children = [Child(spec, self.runtime_dir / f"notify-{i}.sock") for i, spec in enumerate(specs)]
            signal.signal(signal.SIGINT, self._request_stop)
            signal.signal(signal.SIGTERM, self._request_stop)
            broker, rest = self.children[0], self.children[1:]
            broker.start()
            failed = self._start_up([broker])
            if failed is None:
                for child in rest:
                    child.start()
                failed = self._start_up(rest)
            if failed is not None:
                return failed
            if self.stop_requested:
                return 0
            log.info("ready: http://%s:%d (broker, %d worker(s), frontend)", self.settings.host, self.settings.port,
                     len(rest) - 1)
            sdnotify.ready(f"serving on http://{self.settings.host}:{self.settings.port}")
            return self._supervise()
        finally:
            self._shutdown()

    def _start_up(self, children: list[Child]) -> int | None:
        """Wait until every child is ready; a child that exits first ends serve (its status is returned)."""
        while not self.stop_requested:
            for child in children:
                child.read_notifications()
                code = child.exit_code()
                if code is not None and not child.ready:
                    log.error("%s could not start (exit code %d): %s", child.name, code, child.reason())
                    return EXIT_MODEL_ERROR if code == EXIT_MODEL_ERROR else 1
            if all(child.ready for child in children):
                return None
            time.sleep(0.05)
        return None

    def _supervise(self) -> int:
        while not self.stop_requested:
            time.sleep(0.2)
            now = time.monotonic()
            for child in self.children:
                child.read_notifications()
                code = child.exit_code()
                if code is None:
                    if now - child.started > STABLE_AFTER_S:
                        child.backoff = 1.0
                    continue
                if child.next_start == 0.0:
                    if code == EXIT_MODEL_ERROR:
                        log.error("%s cannot load the model (exit code %d): %s", child.name, code, child.reason())
                        return EXIT_MODEL_ERROR
                    child.next_start = now + child.backoff
                    log.warning("%s exited with code %d; starting it again in %.0f s", child.name, code, child.backoff)
                    child.backoff = min(child.backoff * 2, MAX_BACKOFF_S)
                elif now >= child.next_start:
                    child.next_start = 0.0
                    child.restarts += 1
                    child.start()
        return 0

    def _shutdown(self) -> None:
        """Frontend first (no new requests), then workers (drain), then the broker."""
        by_role = {role: [c for c in self.children if c.spec.role == role] for role in ("frontend", "worker", "broker")}
        for stage in by_role.values():
            for child in stage:
                child.signal(signal.SIGTERM)
            for child in stage:
                if child.alive() and child.wait_exit(STOP_TIMEOUT_S) is None:
                    log.warning("%s did not stop within %.0f s; killing it", child.name, STOP_TIMEOUT_S)
                    child.signal(signal.SIGKILL)
                    child.wait_exit(5.0)
        for child in self.children:
            child.notifications.close()
        if self.runtime_dir is not None:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
        if self.children:
            log.info("all processes stopped")
