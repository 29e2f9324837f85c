"""bench/step_size.py on the CPU: every cap gets a row, the steps respect the cap, the largest cap is the unit."""

from __future__ import annotations

import json
from pathlib import Path

from quiver.bench.corpus import mixed_lengths
from quiver.bench.step_size import main, steps_for
from quiver.common.model_info import default_model_dir


def test_steps_hold_at_most_the_cap_and_every_length_once() -> None:
    lengths = mixed_lengths(300, 8, 256)
    for cap in (256, 1024):
        steps = steps_for(lengths, cap, vocab=1000)
        assert [int(n) for step in steps for n in step.seq_lens] == lengths
        assert all(step.num_tokens <= cap or step.num_seqs == 1 for step in steps)


def test_a_run_reports_each_cap(tmp_path: Path) -> None:
    out = tmp_path / "step_size.json"
    assert main(["--model", str(default_model_dir()), "--device", "cpu", "--caps", "256,1024", "--texts", "40",
                 "--rounds", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [row["cap"] for row in report["rows"]] == [256, 1024]
    assert report["rows"][-1]["share_of_largest"] == 1.0
    assert all(row["tokens_per_s"] > 0 and row["steps"] >= 1 for row in report["rows"])
    assert report["rows"][0]["steps"] > report["rows"][1]["steps"]
