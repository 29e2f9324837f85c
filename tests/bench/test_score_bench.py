"""The scoring benchmark runs end to end on the CPU: a one-layer reranker of the BGE-reranker-v2-m3 shape
written at run time, transformers in-process, and a real `quiver serve` timed with both clients; checked
for what it reports and for the two clients' agreement, not for speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from quiver.bench.score_bench import DOC_COUNTS


def test_score_bench_times_quiver_with_both_clients_and_their_rankings_agree(tmp_path: Path) -> None:
    out = tmp_path / "score.json"
    done = subprocess.run(
        [sys.executable, "-m", "quiver.bench.score_bench", str(out), "--device", "cpu", "--layers", "1",
         "--iters", "1", "--warmup", "1", "--ckpt-dir", str(tmp_path / "ckpts")],
        capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    for runner in ("quiver", "quiver_httpx", "transformers"):
        latency = result[runner]["latency_ms"]
        assert sorted(map(int, latency)) == list(DOC_COUNTS), runner
        assert all(0 < figures["p50"] <= figures["max"] for figures in latency.values()), runner
    for count in map(str, DOC_COUNTS):
        raw, library = result["quiver"]["ranked"][count], result["quiver_httpx"]["ranked"][count]
        assert sorted(index for index, _ in raw) == list(range(int(count)))
        # The same request through either client: the same score for every document, each list ranked by
        # its scores. Not bit for bit: a long request's first documents go out while the rest tokenize, so
        # which documents share a step depends on timing, and a CPU step's sums round by its batch.
        scores, other = dict(raw), dict(library)
        assert scores.keys() == other.keys() and all(abs(scores[i] - other[i]) < 1e-5 for i in scores), count
        for ranked in (raw, library):
            assert [score for _, score in ranked] == sorted((score for _, score in ranked), reverse=True)
        # The worker's eager steps during the run (none on a CPU worker, whose steps are all plain forwards).
        assert set(result["quiver"]["eager"][count]) == {"eager_steps", "eager_new_shapes", "eager_warmups"}, count
        samples = result["quiver"]["samples_ms"][count]
        assert len(samples) == result["quiver"]["latency_ms"][count]["n"] and max(samples) == pytest.approx(
            result["quiver"]["latency_ms"][count]["max"], abs=1e-3)
        stages = result["quiver"]["server_stages_ms"][count]
        assert 0 < stages["inference"]["p50"] <= stages["total"]["p50"] <= result["quiver"]["latency_ms"][count]["max"]
    assert all(difference < 0.01 for difference in result["max_score_difference"].values())
    assert "| quiver | " in done.stdout and "| quiver_httpx | " in done.stdout and "| transformers | " in done.stdout
