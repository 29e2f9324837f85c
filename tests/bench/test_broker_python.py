"""The broker's Python-only benchmark runs its real handlers on a few chunks and answers every one."""

from __future__ import annotations

import subprocess
import sys


def test_broker_python_answers_every_chunk_it_is_fed() -> None:
    done = subprocess.run([sys.executable, "-m", "quiver.bench.broker_python", "--chunks", "50", "--rounds", "2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "(50 chunks × 2 rounds; 200 messages sent)" in done.stdout
