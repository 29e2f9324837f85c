"""bench/gc_pauses.py: the probe logs a process's collections, and the summary counts a server's
processes only, inside the window asked for."""

from __future__ import annotations

import os
import subprocess
import sys

from quiver.bench.gc_pauses import install, summary


def test_the_probe_logs_a_full_collection_of_a_process_started_with_it(tmp_path):
    site = install(tmp_path)
    env = {**os.environ, "GC_PAUSES": str(tmp_path), "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    subprocess.run([sys.executable, "-c", "import gc\ngc.collect()"], env=env, check=True)
    logs = list(tmp_path.glob("*.log"))
    assert len(logs) == 1
    lines = logs[0].read_text().splitlines()
    assert lines[0].startswith("argv ") and "gc.collect()" in lines[0]  # the command line on one line
    assert any(line.split()[1] == "2" for line in lines[1:])


def test_the_summary_counts_the_servers_processes_within_the_window(tmp_path):
    (tmp_path / "11.log").write_text("argv python -m quiver frontend --port 1\n5.0 2 30.0\n15.0 2 2.0\n16.0 1 0.5\n")
    (tmp_path / "12.log").write_text("argv python -c import sys\n15.0 2 99.0\n")  # not one of the server's
    table = summary(tmp_path, since=10.0, until=20.0)
    assert "| frontend (11) | 2 | 2 | 30.00 | 32.0 | 1 | 2.00 |" in table
    assert "| frontend (11) | 1 | 1 | 0.50 | 0.5 | 1 | 0.50 |" in table
    assert "(12)" not in table
