"""engine_bench's batch-1 lengths: chosen on the command line and tabled as chosen (CPU; no engine runs)."""

from __future__ import annotations

from quiver.bench import engine_bench


def test_lengths_are_read_from_the_command_line_and_default_to_the_bucket_lengths() -> None:
    parser = engine_bench.build_parser()
    assert parser.parse_args(["--out", "x.json", "--lengths", "500,4000"]).lengths == (500, 4000)
    assert parser.parse_args(["--out", "x.json"]).lengths == engine_bench.LATENCY_LENGTHS


def test_the_latency_table_has_a_column_for_each_length_asked_for() -> None:
    figures = {"p50": 1.0, "p90": 1.1, "p99": 1.2, "max": 1.3}
    result = {"model": "m", "engines": {"bfloat16": {"engine_latency_ms": {500: figures, 4000: figures},
                                                     "engine_throughput": {}}}}
    header, _, row = engine_bench.markdown([result], (500, 4000)).splitlines()[:3]
    assert "500 tok" in header and "4000 tok" in header and "128 tok" not in header
    assert row == "| m | bfloat16 | 1.0 / 1.1 / 1.2 / 1.3 | 1.0 / 1.1 / 1.2 / 1.3 |"
