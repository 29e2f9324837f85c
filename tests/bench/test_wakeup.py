"""bench/wakeup.py runs on a CPU host and reports every path at every gap."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the pipe runs need two CPUs")
def test_quick_run_reports_each_path_at_each_gap(tmp_path):
    out = tmp_path / "wakeup.json"
    result = subprocess.run([sys.executable, "-m", "quiver.bench.wakeup", "--requests", "20", "--gaps-us", "0,500",
                             "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    figures = json.loads(out.read_text())
    for path in ("pipe free", "pipe keeper", "zmq free", "zmq pinned"):
        for gap in ("0", "500"):
            p50, p99 = figures[path][gap]
            assert 0 < p50 <= p99, (path, gap)
    assert "| zmq pinned |" in result.stdout
