"""`quiver serve`: broker, workers and frontend as child processes of one supervisor.

Start-up is checked: a broker that cannot bind, or a model that cannot be loaded, ends `serve` with a
non-zero status and a message saying why. After that, a child that dies is started again with a
backoff. SIGINT/SIGTERM stop the frontend first, then let the workers drain, then stop the broker.
Children run in their own session (so a terminal's Ctrl-C reaches only the supervisor, which orders
the shutdown) and are sent SIGTERM by the kernel if the supervisor itself dies.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from quiver.common.config import BrokerSettings, FrontendSettings, ServeSettings, WorkerSettings, to_argv
from quiver.common.config import default_http_processes
from quiver.common.model_info import EXIT_MODEL_ERROR, ModelError, default_model_dir, load_model_info

log = logging.getLogger("quiver.serve")

STARTUP_GRACE_S = 1.5
STOP_TIMEOUT_S = 30.0
MAX_BACKOFF_S = 30.0
STABLE_AFTER_S = 60.0
PR_SET_PDEATHSIG = 1
DEFAULT_GPU_BUSY_POLL_US = 500


def _die_with_parent() -> None:
    """Run in each child before exec: SIGTERM it when the supervisor goes away."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


@dataclass
class Child:
    name: str
    argv: list[str]
    process: subprocess.Popen | None = None
    started: float = 0.0
    restarts: int = 0
    next_start: float = 0.0
    backoff: float = 1.0
    stopping: bool = field(default=False)

    def start(self) -> None:
        self.process = subprocess.Popen(self.argv, start_new_session=True, preexec_fn=_die_with_parent)
        self.started = time.monotonic()
        log.info("started %s (pid %d)", self.name, self.process.pid)

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signum)


def _visible_gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


class Supervisor:
    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        self.stop_requested = False
        self.broker: Child | None = None
        self.workers: list[Child] = []
        self.frontend: Child | None = None

    def _request_stop(self, signum: int, _frame: object) -> None:
        log.info("%s: shutting down", signal.Signals(signum).name)
        self.stop_requested = True

    def _quiver(self, role: str, argv: list[str]) -> list[str]:
        return [sys.executable, "-m", "quiver", role, *argv]

    def _plan(self) -> None:
        s = self.settings
        model = s.model or str(default_model_dir())
        common = dict(heartbeat_interval_s=s.heartbeat_interval_s, liveness=s.liveness, log_level=s.log_level)

        gpus = _visible_gpus() if s.device in ("", "cuda") else 0
        device = s.device or ("cuda" if gpus else "cpu")
        if device == "cuda" and gpus == 0:
            raise ModelError("--device cuda was given but no GPU is visible")
        if device == "cuda":
            devices = [f"cuda:{i}" for i in range(s.workers or gpus)]
        else:
            devices = ["cpu"] * (s.workers or 1)
        # Busy polling buys latency with CPU time: worth it beside GPUs, not where the CPUs do the work.
        busy_poll_us = s.busy_poll_us if s.busy_poll_us >= 0 else (DEFAULT_GPU_BUSY_POLL_US if device == "cuda" else 0)

        broker = BrokerSettings(frontend_endpoint=s.frontend_endpoint, worker_endpoint=s.worker_endpoint,
                                max_queued_chunks=s.max_queued_chunks, max_retries=s.max_retries,
                                metrics_port=s.broker_metrics_port, busy_poll_us=busy_poll_us, **common)
        self.broker = Child("broker", self._quiver("broker", to_argv(broker, BrokerSettings)))

        threads = s.threads or max(1, (os.cpu_count() or 1) // len(devices))
        for index, dev in enumerate(devices):
            name = dev if dev != "cpu" else f"cpu-{index}"
            worker = WorkerSettings(
                broker=s.worker_endpoint, model=model, device=dev, dtype=s.dtype, max_batch_tokens=s.max_batch_tokens,
                threads=threads if dev == "cpu" else 0, name=name, busy_poll_us=busy_poll_us,
                metrics_port=(s.worker_metrics_port + index) if s.worker_metrics_port else 0, **common,
            )
            self.workers.append(Child(f"worker {name}", self._quiver("worker", to_argv(worker, WorkerSettings))))

        frontend_fields = {k: getattr(s, k) for k in FrontendSettings.__dataclass_fields__}
        frontend = FrontendSettings(**{**frontend_fields, "broker": s.frontend_endpoint, "model": model,
                                       "http_processes": s.http_processes or default_http_processes(
                                           len(devices) if device == "cuda" else 0, os.cpu_count() or 1)})
        self.frontend = Child("frontend", self._quiver("frontend", to_argv(frontend, FrontendSettings)))

    def _children(self) -> list[Child]:
        return [c for c in (self.frontend, *self.workers, self.broker) if c is not None]

    def run(self) -> int:
        try:
            info = load_model_info(self.settings.model or default_model_dir())
            self._plan()
        except ModelError as exc:
            log.error("cannot serve: %s", exc)
            return 2
        log.info("serving %s (%s) with %d worker(s) on %s", info.name, info.kind, len(self.workers),
                 ", ".join(sorted({w.argv[w.argv.index('--device') + 1] for w in self.workers})))
        signal.signal(signal.SIGINT, self._request_stop)
        signal.signal(signal.SIGTERM, self._request_stop)
        assert self.broker is not None and self.frontend is not None
        self.broker.start()
        if self._wait_exit(self.broker, STARTUP_GRACE_S) is not None:
            log.error("the broker could not start (exit code %s); see its log above", self.broker.exit_code())
            return 1
        for worker in self.workers:
            worker.start()
        self.frontend.start()
        try:
            return self._supervise()
        finally:
            self._shutdown()

    @staticmethod
    def _wait_exit(child: Child, seconds: float) -> int | None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            code = child.exit_code()
            if code is not None:
                return code
            time.sleep(0.05)
        return None

    def _supervise(self) -> int:
        while not self.stop_requested:
            time.sleep(0.2)
            now = time.monotonic()
            for child in self._children():
                code = child.exit_code()
                if code is None:
                    if now - child.started > STABLE_AFTER_S:
                        child.backoff = 1.0
                    continue
                if child.next_start == 0.0:
                    if code == EXIT_MODEL_ERROR:
                        log.error("%s cannot load the model (exit code %d); see its log above", child.name, code)
                        return 1
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
        stages = [[self.frontend], self.workers, [self.broker]]
        for stage in stages:
            for child in stage:
                if child is not None:
                    child.signal(signal.SIGTERM)
            for child in stage:
                if child is not None and self._wait_exit(child, STOP_TIMEOUT_S) is None:
                    log.warning("%s did not stop within %.0f s; killing it", child.name, STOP_TIMEOUT_S)
                    child.signal(signal.SIGKILL)
                    self._wait_exit(child, 5.0)
        log.info("all processes stopped")
