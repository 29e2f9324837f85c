"""The batch runner in a child process of the frontend (jobs/runner_process.py), and inline on request."""

from __future__ import annotations

import io
import os
import signal
import time
from pathlib import Path

import openai

from quiver.jobs.runner_process import FIRST_RESTART_WAIT_S, MAX_RESTART_WAIT_S, STABLE_S, restart_wait
from tests.jobs.helpers import embedding_lines, wait_final

RUNNER_MODULE = "quiver.jobs.runner_process"


def runner_children(pid: int) -> list[int]:
    """The runner processes whose parent is `pid` (read from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        parent = int(stat.rpartition(")")[2].split()[1])
        if parent == pid and RUNNER_MODULE in cmdline:
            found.append(int(entry.name))
    return found


def wait_for(predicate, timeout: float = 30.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def run_small_batch(url: str, count: int = 40) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    uploaded = client.files.create(file=("r.jsonl", io.BytesIO("\n".join(embedding_lines(count)).encode())),
                                   purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/embeddings", completion_window="24h")
    batch = wait_final(client, batch.id)
    assert batch.status == "completed" and batch.request_counts.completed == count, batch


def test_the_runner_works_in_one_child_process_of_the_frontend(jobs_cluster):
    frontend_pid = jobs_cluster.frontend.popen.pid
    assert wait_for(lambda: len(runner_children(frontend_pid)) == 1), runner_children(frontend_pid)
    run_small_batch(jobs_cluster.url)
    assert "batch runner process" in jobs_cluster.frontend.log()


def test_a_frontend_killed_with_minus_9_leaves_no_runner_behind(jobs_cluster, tmp_path):
    proc, _ = jobs_cluster.extra_frontend(["--data-dir", str(tmp_path / "data")])
    assert wait_for(lambda: len(runner_children(proc.popen.pid)) == 1)
    (child,) = runner_children(proc.popen.pid)
    proc.signal(signal.SIGKILL)
    proc.wait(10)

    def gone() -> bool:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return True
        return Path(f"/proc/{child}/stat").read_text().rpartition(")")[2].split()[0] == "Z"

    assert wait_for(gone, 15.0), f"runner {child} outlived its frontend"


def test_an_inline_runner_runs_batches_on_the_frontends_own_loop(jobs_cluster, tmp_path):
    proc, url = jobs_cluster.extra_frontend(["--batch-runner", "inline", "--data-dir", str(tmp_path / "data")])
    run_small_batch(url)
    assert runner_children(proc.popen.pid) == []


def test_a_runner_process_that_dies_is_started_again(jobs_cluster, tmp_path):
    proc, url = jobs_cluster.extra_frontend(["--data-dir", str(tmp_path / "data")])
    assert wait_for(lambda: len(runner_children(proc.popen.pid)) == 1)
    (first,) = runner_children(proc.popen.pid)
    os.kill(first, signal.SIGKILL)
    assert wait_for(lambda: runner_children(proc.popen.pid) not in ([], [first])), runner_children(proc.popen.pid)
    run_small_batch(url)
    assert "starting it again" in proc.log()


def test_a_runner_process_that_keeps_failing_at_start_is_restarted_less_and_less_often():
    waits, wait = [], FIRST_RESTART_WAIT_S
    for _ in range(7):
        wait = restart_wait(wait, lived_s=0.5)
        waits.append(wait)
    assert waits == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0] and waits[-1] == MAX_RESTART_WAIT_S
    assert restart_wait(MAX_RESTART_WAIT_S, lived_s=STABLE_S + 1) == FIRST_RESTART_WAIT_S
