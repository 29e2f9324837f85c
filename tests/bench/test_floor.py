"""The floor benchmark runs end to end on the CPU (--quick): real broker and worker processes over
pyzmq, a real uvicorn server, and a real `quiver serve`; checked for the table's shape, not for speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from quiver.bench.floor import _cpu_now


def test_floor_quick_prints_the_floor_and_quivers_overhead(tmp_path: Path) -> None:
    out = tmp_path / "floor.json"
    done = subprocess.run([sys.executable, "-m", "quiver.bench.floor", "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = result["floor_rows"]
    assert len(rows) == 5  # four worker shapes (no hand-off, Queue, SimpleQueue, inproc PAIR), blocking; Starlette
    for p50, p99 in rows.values():
        assert 0 < p50 <= p99
    assert result["floor_p50"] > 0
    assert list(result["quiver"]) == ["128"]
    row = result["quiver"]["128"]
    assert 0 < row["overhead_p50"] <= row["client_p50"] and row["client_p50"] <= row["client_p99"]
    assert len(result["idle_cpu"]) >= 4  # the supervisor, broker, worker and frontend at least
    assert all(0 <= cores for cores in result["idle_cpu"].values())
    cpu = row["cpu_us_per_request"]
    for role in ("quiver frontend", "quiver broker", "quiver worker"):  # each did work for every request
        assert [micros for process, micros in cpu.items() if role in process and micros > 0], (role, cpu)
    tei = row["tei"]  # the same ids through /embed
    assert 0 < tei["overhead_p50"] <= tei["client_p50"] <= tei["client_p99"]
    text = row["text"]  # a text of 128 tokens: the step and the frontend's tokenization timed alone taken off
    for timing in ("warm", "spaced"):
        assert 0 < text[f"tokenize_{timing}_p50"] <= text[f"tokenize_{timing}_p99"]
    assert text["client_p50"] <= text["client_p99"]
    assert 0 < text["overhead_p50"] < text["client_p50"] - text["tokenize_spaced_p50"]
    table = done.stdout
    assert result["floor_p50_by_length"] == {"128": result["floor_p50"]}
    assert "| floor at 128 tokens: pyzmq blocking (no hand-off) + Starlette |" in table
    assert table.count("\n| 128 |") == 3 and "overhead / floor" in table and "tokenization alone" in table
    assert "ids on /embed" in table


def test_cpu_of_processes_skips_one_that_ended():
    """A server's helper process (a compiler worker, say) may end while the server is measured."""
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    seconds = _cpu_now([os.getpid(), ended.pid])
    assert list(seconds) == [os.getpid()] and seconds[os.getpid()] > 0
