"""Real Quiver processes on loopback for tests: a broker, workers and a frontend, each its own process.

Every process is started as `python -m quiver <role>` with free ports, its output captured in a log
file that is printed when a test fails to start the cluster.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Process:
    name: str
    argv: list[str]
    log_path: Path
    popen: subprocess.Popen | None = None

    def start(self, env: dict[str, str]) -> None:
        log = open(self.log_path, "ab")
        self.popen = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            self.popen.send_signal(signum)  # type: ignore[union-attr]

    def wait(self, timeout: float) -> int | None:
        try:
            return self.popen.wait(timeout) if self.popen else None
        except subprocess.TimeoutExpired:
            return None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@dataclass
class Cluster:
    workers: int = 2
    model: str = ""
    frontend_args: list[str] = field(default_factory=list)
    worker_args: list[str] = field(default_factory=list)
    broker_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    heartbeat_interval_s: float = 0.25

    def __post_init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="quiver-test-"))
        self.http_port = free_port()
        self.frontend_endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.worker_endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.broker: Process | None = None
        self.worker_procs: list[Process] = []
        self.frontend: Process | None = None
        self.extra_frontends: list[Process] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def _argv(self, role: str, *args: str) -> list[str]:
        return [sys.executable, "-m", "quiver", role, "--heartbeat-interval-s", str(self.heartbeat_interval_s), *args]

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUIVER_")}
        env.update({"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
                    "QUIVER_DATA_DIR": str(self.dir / "data"), **self.env})
        return env

    def start_broker(self) -> Process:
        self.broker = Process("broker", self._argv(
            "broker", "--frontend-endpoint", self.frontend_endpoint, "--worker-endpoint", self.worker_endpoint,
            *self.broker_args), self.dir / "broker.log")
        self.broker.start(self._env())
        return self.broker

    def start_worker(self, index: int | None = None, extra: list[str] | None = None,
                     env: dict[str, str] | None = None) -> Process:
        index = len(self.worker_procs) if index is None else index
        model = ["--model", self.model] if self.model else []
        proc = Process(f"worker{index}", self._argv(
            "worker", "--broker", self.worker_endpoint, "--device", "cpu", "--threads", "1",
            "--name", f"cpu-{index}", *model, *self.worker_args, *(extra or [])), self.dir / f"worker{index}.log")
        proc.start({**self._env(), **(env or {})})
        if index < len(self.worker_procs):
            self.worker_procs[index] = proc
        else:
            self.worker_procs.append(proc)
        return proc

    def start_frontend(self) -> Process:
        self.frontend = self._frontend_process("frontend", self.http_port, self.frontend_args)
        return self.frontend

    def extra_frontend(self, args: list[str], timeout: float = 30.0) -> tuple[Process, str]:
        """Another frontend on the same broker, with its own options; returns it and its URL once healthy."""
        port = free_port()
        proc = self._frontend_process(f"frontend-{port}", port, args)
        self.extra_frontends.append(proc)
        url = f"http://127.0.0.1:{port}"
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    return proc, url
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"frontend on port {port} did not become healthy:\n{proc.log()}")

    def _frontend_process(self, name: str, port: int, args: list[str]) -> Process:
        model = ["--model", self.model] if self.model else []
        proc = Process(name, self._argv("frontend", "--broker", self.frontend_endpoint, "--port", str(port),
                                        *model, *args), self.dir / f"{name}.log")
        proc.start(self._env())
        return proc

    def start(self, timeout: float = 90.0) -> Cluster:
        self.start_broker()
        for _ in range(self.workers):
            self.start_worker()
        self.start_frontend()
        self.wait_live_workers(self.workers, timeout)
        return self

    def processes(self) -> list[Process]:
        return [p for p in (self.frontend, *self.extra_frontends, *self.worker_procs, self.broker) if p is not None]

    def health(self) -> httpx.Response:
        return httpx.get(self.url + "/health", timeout=5)

    def wait_live_workers(self, count: int, timeout: float = 90.0) -> None:
        """Wait until /health reports `count` live workers; raise with every log when it does not."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for proc in self.processes():
                if proc.popen is not None and not proc.alive() and proc.name in ("broker", "frontend"):
                    raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{self.logs()}")
            try:
                response = self.health()
                if response.status_code == 200 and response.json()["live_workers"] == count:
                    return
                if count == 0 and "no worker is live" in response.text:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the cluster did not reach {count} live workers in {timeout} s:\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"----- {p.name} -----\n{p.log()[-6000:]}" for p in self.processes())

    def stop(self) -> None:
        for proc in self.processes():
            proc.signal(signal.SIGTERM)
        for proc in self.processes():
            if proc.wait(10) is None:
                proc.signal(signal.SIGKILL)
                proc.wait(5)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        """Stop every process; when the block failed, print their logs first (pytest shows a failed test's
        output), so that a failure under load carries the processes' own timeline."""
        if exc_type is not None:
            print(self.logs())
        self.stop()
