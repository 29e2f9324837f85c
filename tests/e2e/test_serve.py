"""`quiver serve` as a user runs it: starts everything, restarts a crashed worker, stops cleanly,
and refuses to start (non-zero, with a reason) when the broker or the model cannot."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.cluster import free_port


def children_of(pid: int) -> dict[int, str]:
    """Direct children of a process and their command lines, read from /proc."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
    return found


def serve(*args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str, Path]:
    port = free_port()
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"quiver-serve-{port}.log"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("QUIVER_")}
    full_env.update({"PYTHONUNBUFFERED": "1", "QUIVER_HEARTBEAT_INTERVAL_S": "0.25", **(env or {})})
    argv = [sys.executable, "-m", "quiver", "serve", "--port", str(port),
            "--frontend-endpoint", f"tcp://127.0.0.1:{free_port()}",
            "--worker-endpoint", f"tcp://127.0.0.1:{free_port()}", *args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=full_env)
    return proc, f"http://127.0.0.1:{port}", log_path


def wait_workers(url: str, count: int, proc: subprocess.Popen, log_path: Path, timeout: float = 90) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, log_path.read_text()
        try:
            response = httpx.get(url + "/health", timeout=2)
            if response.status_code == 200 and response.json()["live_workers"] == count:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"never saw {count} live workers:\n{log_path.read_text()}")


def test_serve_runs_restarts_a_crashed_worker_and_stops_cleanly():
    proc, url, log_path = serve("--workers", "2", "--threads", "1")
    try:
        wait_workers(url, 2, proc, log_path)
        response = httpx.post(url + "/embed", json={"inputs": ["served by quiver serve"]}, timeout=30)
        assert response.status_code == 200 and len(response.json()[0]) == 384

        children = children_of(proc.pid)
        workers = [pid for pid, cmd in children.items() if " worker " in cmd]
        assert len(workers) == 2 and any(" broker " in c for c in children.values())
        os.kill(workers[0], signal.SIGKILL)
        time.sleep(1.5)  # the broker's liveness window passes, the supervisor starts a new worker
        wait_workers(url, 2, proc, log_path)
        new_workers = [pid for pid, cmd in children_of(proc.pid).items() if " worker " in cmd]
        assert workers[0] not in new_workers and len(new_workers) == 2
        assert httpx.post(url + "/embed", json={"inputs": "after the crash"}, timeout=30).status_code == 200

        every_child = list(children_of(proc.pid))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log_path.read_text()
        for pid in every_child:
            assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text(), pid
        assert "all processes stopped" in log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_serve_exits_nonzero_when_the_model_cannot_load(tmp_path):
    proc, _, log_path = serve("--model", str(tmp_path / "missing"))
    assert proc.wait(60) != 0
    assert "does not exist" in log_path.read_text()

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "bert", "hidden_size": 8, "vocab_size": 10, '
                                        '"max_position_embeddings": 16}')
    from quiver.common.model_info import default_model_dir

    (broken / "tokenizer.json").write_bytes((default_model_dir() / "tokenizer.json").read_bytes())
    proc, _, log_path = serve("--model", str(broken), "--workers", "1")
    assert proc.wait(90) != 0
    text = log_path.read_text()
    assert "cannot load the model" in text, text


def test_serve_exits_nonzero_when_the_broker_cannot_bind():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc, _, log_path = serve("--frontend-endpoint", f"tcp://127.0.0.1:{port}")
        assert proc.wait(60) != 0
    text = log_path.read_text()
    assert "broker could not start" in text and "bind" in text, text


@pytest.mark.parametrize("role", ["serve", "broker", "frontend", "worker"])
def test_every_command_has_help(role):
    out = subprocess.run([sys.executable, "-m", "quiver", role, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "QUIVER_" in out.stdout


def test_options_come_from_the_environment():
    out = subprocess.run([sys.executable, "-m", "quiver", "frontend", "--help"], capture_output=True, text=True,
                         env={**os.environ, "QUIVER_PORT": "9999"}, timeout=60)
    assert "default 9999" in out.stdout
