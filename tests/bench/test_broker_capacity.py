"""The broker-capacity benchmark's --quick run against the real broker process, with stand-in peers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest


@pytest.mark.parametrize("options", [[], ["--curve"], ["--transport", "ipc", "--curve"]], ids=["plain", "curve", "ipc"])
def test_quick_run_routes_every_chunk_through_each_worker_and_reports_hops(tmp_path, options):
    # Its own temporary folder, short enough for Unix socket paths: the run must leave nothing in it.
    scratch = Path(tempfile.mkdtemp(prefix="qb-"))
    try:
        result = subprocess.run([sys.executable, "-m", "quiver.bench.broker_capacity", "--quick", "--out", str(tmp_path),
                                 *options], capture_output=True, text=True, timeout=600,
                                env={**os.environ, "TMPDIR": str(scratch)})
        left = sorted(p.name for p in scratch.iterdir())
    finally:
        shutil.rmtree(scratch)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert left == []  # socket folders and keys are removed with each run
    results = json.loads((tmp_path / "broker_capacity.json").read_text())
    assert results["meta"]["curve"] == ("--curve" in options)
    rows = results["rows"]
    assert [(row["workers"], row["window"]) for row in rows] == [(0, 32), (0, 1), (1, 32), (1, 1), (2, 32), (2, 1)]
    for row in rows:
        assert row["chunks"] > 0 and row["chunks_per_s"] > 0
        assert row["errors"] == row["wrong_answers"] == row["unanswered"] == row["worker_bad_messages"] == 0
        assert row["unmatched"] == 0  # every answer was produced by a stand-in worker that saw the chunk
        for hop in ("hop_in_us", "hop_out_us", "round_trip_us"):
            assert 0 < row[hop]["p50"] <= row[hop]["p99"]
        if row["workers"]:
            assert row["broker_cpu_us_per_chunk"] > 0 and row["broker_core_share"] > 0
        else:
            assert row["broker_cpu_us_per_chunk"] is None
    two_loaded = rows[4]
    assert two_loaded["workers_used"] == 2  # the broker spread a full window over both workers
    table = (tmp_path / "broker_capacity.md").read_text()
    assert "| none (direct) | 2×32 |" in table and "| 2 | 2×1 |" in table


def test_saturated_quick_run_answers_every_chunk_through_the_broker_and_the_floor(tmp_path):
    result = subprocess.run([sys.executable, "-m", "quiver.bench.broker_capacity", "--quick", "--saturate",
                             "--out", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads((tmp_path / "broker_capacity_saturated.json").read_text())["rows"]
    assert [(row["router"], row["workers"]) for row in rows] == [("floor", 1), ("broker", 1), ("floor", 2), ("broker", 2)]
    for row in rows:
        assert row["chunks"] > 0 and row["wrong_answers"] == row["unanswered"] == 0
        assert row["answered_by_workers"] >= row["chunks"]  # every answer came from a stand-in worker
        assert row["router_core_share"] > 0 and row["one_core_chunks_per_s"] > 0
        assert 0 < row["round_trip_us"]["p50"] <= row["round_trip_us"]["p99"]
    table = (tmp_path / "broker_capacity_saturated.md").read_text()
    assert "| broker | 2 | 2×64 |" in table


def test_paced_run_offers_the_rate_and_reports_what_the_broker_adds_over_the_floor(tmp_path):
    result = subprocess.run([sys.executable, "-m", "quiver.bench.broker_capacity", "--quick", "--saturate",
                             "--rate", "500", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads((tmp_path / "broker_capacity_saturated.json").read_text())["rows"]
    for row in rows:
        assert row["rate"] == 500 and row["wrong_answers"] == row["unanswered"] == 0
        assert 400 <= row["chunks"] <= 600  # one second at 500/s: paced, not a window kept full
    table = (tmp_path / "broker_capacity_saturated.md").read_text()
    broker_row = next(line for line in table.splitlines() if line.startswith("| broker | 1 | 500/s |"))
    assert broker_row.rstrip(" |").split("|")[-1].strip() != "-"  # the added latency over the floor is there
