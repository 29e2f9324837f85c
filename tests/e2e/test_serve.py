"""`quiver serve` as a user runs it: starts everything, restarts a crashed worker, stops cleanly,
refuses to start (non-zero, with the child's reason) when the broker, the frontend or the model
cannot, runs twice on one host, exposes every role's metrics, and keeps the API key off command lines."""

from __future__ import annotations

import os
import shutil
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


def serve(*args: str, env: dict[str, str] | None = None, port: int = 0) -> tuple[subprocess.Popen, str, Path]:
    """`quiver serve` with its defaults (private broker endpoints, default metrics ports) but a free HTTP port."""
    port = port or free_port()
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"quiver-serve-{port}.log"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("QUIVER_")}
    full_env.update({"PYTHONUNBUFFERED": "1", "QUIVER_HEARTBEAT_INTERVAL_S": "0.25", **(env or {})})
    argv = [sys.executable, "-m", "quiver", "serve", "--port", str(port), *args]
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

        every_child = children_of(proc.pid)
        broker = next(cmdline for cmdline in every_child.values() if " broker " in cmdline)
        runtime_dir = Path(option_value(broker, "--frontend-endpoint").removeprefix("ipc://")).parent
        assert runtime_dir.stat().st_mode & 0o077 == 0  # the broker's sockets are this serve's alone
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log_path.read_text()
        assert not runtime_dir.exists()
        for pid in every_child:
            assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text(), pid
        assert "all processes stopped" in log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()


def option_value(cmdline: str, flag: str) -> str:
    words = cmdline.split()
    return words[words.index(flag) + 1]


def test_two_serves_on_one_host_each_with_every_roles_metrics_and_no_key_on_a_command_line():
    key = "s3cret-key-never-on-argv"
    env = {"QUIVER_API_KEY": key, "QUIVER_WATCHDOG_S": "7", "QUIVER_MAX_BATCH_SEQS": "48"}
    first, first_url, first_log = serve("--threads", "1", env=env)
    second, second_url, second_log = serve("--threads", "1", env=env)  # at the same moment
    try:
        wait_workers(first_url, 1, first, first_log)
        wait_workers(second_url, 1, second, second_log)
        for url in (first_url, second_url):
            response = httpx.post(url + "/embed", json={"inputs": "two servers"}, timeout=30,
                                  headers={"Authorization": f"Bearer {key}"})
            assert response.status_code == 200, response.text
        ports = []
        for proc, url in ((first, first_url), (second, second_url)):
            children = children_of(proc.pid)
            assert len(children) == 3, children
            for pid, cmdline in children.items():
                assert key not in cmdline
                # Only the frontend, which checks the key, has it, in its environment.
                assert (key.encode() in Path(f"/proc/{pid}/environ").read_bytes()) == (" frontend " in cmdline)
            broker = next(c for c in children.values() if " broker " in c)
            worker = next(c for c in children.values() if " worker " in c)
            assert option_value(broker, "--frontend-endpoint").startswith("ipc://")
            assert option_value(worker, "--watchdog-s") == "7.0" and option_value(worker, "--max-batch-seqs") == "48"
            broker_port, worker_port = int(option_value(broker, "--metrics-port")), int(option_value(worker, "--metrics-port"))
            ports += [broker_port, worker_port]
            assert "quiver_broker_" in httpx.get(f"http://127.0.0.1:{broker_port}/metrics", timeout=10).text
            assert "quiver_worker_" in httpx.get(f"http://127.0.0.1:{worker_port}/metrics", timeout=10).text
            assert "quiver_" in httpx.get(url + "/metrics", timeout=10).text
        assert len(set(ports)) == 4, ports
        if 9300 in ports:
            taken = "port 9300 for the broker's /metrics is taken; using"
            assert taken in first_log.read_text() + second_log.read_text()
    finally:
        for proc in (first, second):
            proc.send_signal(signal.SIGTERM)
        for proc in (first, second):
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()


def test_serve_ends_with_the_frontends_reason_when_its_port_is_taken():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc, _, log_path = serve("--threads", "1", port=taken.getsockname()[1])
        assert proc.wait(120) == 1
    text = log_path.read_text()
    assert "frontend could not start" in text and "address already in use" in text, text
    assert text.count("started frontend") == 1, text


@pytest.mark.parametrize("device", ["gpu", "CUDA", "cuda:x", "cuda:0,0", "cuda0"],
                         ids=["the-word-g-p-u", "upper-case", "not-a-number", "twice", "no-colon"])
def test_serve_refuses_a_malformed_device(device):
    proc, _, log_path = serve("--device", device)
    assert proc.wait(60) == 2
    text = log_path.read_text()
    assert f"--device {device!r}" in text and "started" not in text, text


def truncated_checkpoint(tmp_path: Path) -> Path:
    """The packaged MiniLM with its weights cut in half, as an interrupted download leaves them."""
    from quiver.common.model_info import default_model_dir

    broken = tmp_path / "truncated"
    shutil.copytree(default_model_dir(), broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return broken


def test_a_worker_that_cannot_load_its_model_exits_78_with_one_line(tmp_path):
    broken = truncated_checkpoint(tmp_path)
    out = subprocess.run([sys.executable, "-m", "quiver", "worker", "--model", str(broken), "--broker",
                          f"tcp://127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 78, out.stderr
    errors = [line for line in out.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "SafetensorError" in errors[0], out.stderr
    assert "Traceback" not in out.stderr

    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: --device cuda loads")
    out = subprocess.run([sys.executable, "-m", "quiver", "worker", "--device", "cuda", "--broker",
                          f"tcp://127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 78, out.stderr
    assert "cannot load the model" in out.stderr and "Traceback" not in out.stderr


def test_serve_stops_with_78_when_the_model_cannot_load(tmp_path):
    proc, _, log_path = serve("--model", str(tmp_path / "missing"))
    assert proc.wait(60) == 78
    assert "does not exist" in log_path.read_text()

    proc, _, log_path = serve("--model", str(truncated_checkpoint(tmp_path)), "--threads", "1")
    assert proc.wait(120) == 78
    text = log_path.read_text()
    assert "worker cpu-0 could not start (exit code 78)" in text and "SafetensorError" in text, text
    assert text.count("started worker") == 1, text

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "bert", "hidden_size": 8, "vocab_size": 10, '
                                        '"max_position_embeddings": 16}')
    from quiver.common.model_info import default_model_dir

    (broken / "tokenizer.json").write_bytes((default_model_dir() / "tokenizer.json").read_bytes())
    proc, _, log_path = serve("--model", str(broken), "--workers", "1")
    assert proc.wait(90) == 78
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
