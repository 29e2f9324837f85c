"""A batch survives `quiver serve` killed with -9 (every process at once) midway, and resumes without redoing work."""

from __future__ import annotations

import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

from tests.cluster import free_port
from tests.jobs.helpers import check_job_output, short_lines, wait_final

LINES = 20_000


def _serve(data_dir: Path, log_path: Path, model: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [sys.executable, "-m", "quiver", "serve", "--workers", "1", "--port", str(port), "--data-dir", str(data_dir),
            "--frontend-endpoint", f"tcp://127.0.0.1:{free_port()}", "--worker-endpoint", f"tcp://127.0.0.1:{free_port()}",
            "--heartbeat-interval-s", "0.25", "--model", str(model)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUIVER_")}
    env.update({"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    with open(log_path, "ab") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    end = time.monotonic() + 120
    while time.monotonic() < end:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return process, url
        except httpx.HTTPError:
            pass
        if process.poll() is not None:
            break
        time.sleep(0.2)
    raise AssertionError(f"quiver serve did not become healthy:\n{log_path.read_text()[-4000:]}")


def _descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        children = [child for child, parent in parents.items() if parent == current]
        found += children
        frontier += children
    return found


def _kill_everything(process: subprocess.Popen) -> None:
    for pid in [*_descendants(process.pid), process.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait(10)


def _committed_request_ids(data_dir: Path, batch_id: str) -> dict[int, str]:
    with sqlite3.connect(data_dir / "quiver.db") as db:
        return {line: json.loads(body)["id"] for line, body in
                db.execute("SELECT line, body FROM results WHERE batch_id = ?", (batch_id,))}


def test_a_batch_resumes_after_every_process_is_killed(tmp_path, small_model):
    data_dir = tmp_path / "data"
    log_path = tmp_path / "serve.log"
    process, url = _serve(data_dir, log_path, small_model)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        uploaded = client.files.create(file=("in.jsonl", io.BytesIO("\n".join(short_lines(LINES)).encode())),
                                       purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
        end = time.monotonic() + 600
        while client.batches.retrieve(batch.id).request_counts.completed < LINES // 2:
            assert time.monotonic() < end, log_path.read_text()[-4000:]
            time.sleep(0.1)
    finally:
        _kill_everything(process)
    before = _committed_request_ids(data_dir, batch.id)
    assert 0 < len(before) < LINES, "the kill should land midway"
    assert sorted(before) == list(range(len(before)))  # committed parts are a prefix of the input

    process, url = _serve(data_dir, log_path, small_model)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
        batch = wait_final(client, batch.id, timeout=600)
        assert batch.status == "completed", log_path.read_text()[-4000:]
        assert (batch.request_counts.completed, batch.request_counts.failed) == (LINES, 0)
        outputs = [json.loads(line) for line in client.files.content(batch.output_file_id).text.splitlines()]
        for line, request_id in before.items():  # committed lines were kept, not run again
            assert outputs[line]["id"] == request_id
        check_job_output(url, outputs, LINES)  # every custom_id once, in order, with the online vectors
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            _kill_everything(process)
