"""The frontend-scaling benchmark's --quick run: the real broker and `quiver frontend --http-processes N`
with stand-in workers, every answer checked for its shape."""

from __future__ import annotations

import json
import subprocess
import sys


def test_quick_run_drives_one_and_two_http_processes_without_a_failure(tmp_path):
    result = subprocess.run([sys.executable, "-m", "quiver.bench.frontend_scaling", "--quick", "--out", str(tmp_path)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = json.loads((tmp_path / "frontend_scaling.json").read_text())["rows"]
    assert [row["processes"] for row in rows] == [1, 2]
    for row in rows:
        assert row["failures"] == 0 and row["requests"] > 0 and row["requests_per_s"] > 0
        assert abs(row["texts_per_s"] - 4 * row["requests_per_s"]) <= 4
        assert 0 < row["p50_ms"] <= row["p99_ms"] and row["frontend_cores"] > 0
    assert rows[0]["frontend_pids"] == 1  # one process serves HTTP itself
    assert rows[1]["frontend_pids"] >= 3  # uvicorn's parent and its two HTTP processes
    assert "| 2 |" in (tmp_path / "frontend_scaling.md").read_text()
