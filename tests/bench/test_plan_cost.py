"""The planning benchmark runs the real scheduler on the packaged model and prints a row per chunk count."""

from __future__ import annotations

import subprocess
import sys


def test_plan_cost_prints_a_row_per_number_of_waiting_chunks() -> None:
    done = subprocess.run([sys.executable, "-m", "quiver.bench.plan_cost", "--chunks", "4,16", "--repeats", "2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rows = [line.split("|")[1].strip() for line in done.stdout.splitlines() if line.startswith("| ")]
    assert rows[-2:] == ["4", "16"], done.stdout
