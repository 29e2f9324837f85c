"""The hop trace runs end to end on the CPU (--quick): a real `quiver serve` with the tracer preloaded in
each of its processes; checked for a whole timeline per request, not for speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from quiver.bench.hop_trace import ORDER


# Both arrangements of the worker's broker link (worker/link.py): a result leaves from the link's thread
# after the scheduler's push into the outbox, or straight from the scheduler's thread.
@pytest.mark.parametrize("link_thread", ["on", "off"], ids=["threaded-link", "inline-link"])
def test_hop_trace_quick_lines_up_every_segment_of_a_request(tmp_path: Path, link_thread: str) -> None:
    out = tmp_path / "hops.json"
    done = subprocess.run([sys.executable, "-m", "quiver.bench.hop_trace", "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, QUIVER_LINK_THREAD=link_thread))
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(out.read_text())["32"]
    *hops, whole, outside = rows
    assert [(row["from"], row["to"]) for row in hops] == list(zip(ORDER, ORDER[1:]))
    assert all(0 < row["p50_us"] <= row["p90_us"] for row in rows)
    assert max(row["p50_us"] for row in hops) < whole["p50_us"]  # each segment is a part of the whole request
    step = next(row["p50_us"] for row in hops if row["from"] == "W.launch")
    assert 0 < outside["p50_us"] < whole["p50_us"] and outside["p50_us"] == pytest.approx(whole["p50_us"] - step, rel=0.5)
    assert "| W.launch → W.done |" in done.stdout and "| the whole request less W.launch → W.done |" in done.stdout


def test_hop_trace_detail_stamps_each_call_in_the_order_a_request_meets_them(tmp_path: Path) -> None:
    out = tmp_path / "hops.json"
    done = subprocess.run([sys.executable, "-m", "quiver.bench.hop_trace", "--quick", "--detail", "--json", str(out)],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, QUIVER_LINK_THREAD="off"))
    assert done.returncode == 0, done.stderr[-3000:]
    offsets = {row["stamp"]: row["p50_us"] for row in json.loads(out.read_text())["detail"]["32"]}
    # Stamps met once per request (a heartbeat may also send, receive or decode between them).
    path = ["F E.app>", "F F.parse", "F E.parse>", "F E.parse<", "F E.check_ids>", "F E.chunks>", "W W.accept",
            "W W.launch", "W D.step>", "W D.pack_batch>", "W D.step<", "W W.done", "W W.answer", "F F.encode",
            "F E.respond>", "C headers read", "C end"]
    assert [offsets[stamp] for stamp in path] == sorted(offsets[stamp] for stamp in path), offsets


def test_hop_trace_texts_tokenize_each_request_between_its_parse_and_its_chunk(tmp_path: Path) -> None:
    out = tmp_path / "hops.json"
    done = subprocess.run([sys.executable, "-m", "quiver.bench.hop_trace", "--quick", "--texts", "--detail",
                           "--json", str(out)],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ, QUIVER_LINK_THREAD="off"))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [(row["from"], row["to"]) for row in result["32"][:-2]] == list(zip(ORDER, ORDER[1:]))
    offsets = {row["stamp"]: row["p50_us"] for row in result["detail"]["32"]}
    assert "F E.check_ids>" not in offsets  # a text, not token ids
    path = ["F F.parse", "F E.encode_sync>", "F E.encode_sync<", "F E.chunks>", "W W.accept", "F F.encode"]
    assert [offsets[stamp] for stamp in path] == sorted(offsets[stamp] for stamp in path), offsets
