"""Options: command line over environment over --quick over the defaults."""

from __future__ import annotations

import argparse

import pytest

from quiver.bench.config import QUICK, BenchConfig, add_options, config_from_args


def parse(argv: list[str]) -> BenchConfig:
    parser = argparse.ArgumentParser()
    add_options(parser)
    return config_from_args(parser.parse_args(argv))


def test_defaults_are_the_published_benchmarks():
    config = parse([])
    assert config.latency_lengths == (128, 512, 4096) and config.scoring_documents == (5, 25, 50)
    assert config.throughput_lengths == (512, 1024, 4096) and config.throughput_clients == 4
    assert config.throughput_batch == 100 and config.concurrency_levels == (1, 4, 8, 16, 64)
    assert config.concurrency_requests == 200
    assert config.bulk_texts >= 10_000 and config.min_cosine == 0.999


def test_quick_fills_only_what_was_not_given(monkeypatch):
    monkeypatch.setenv("QUIVER_BENCH_LATENCY_REQUESTS", "7")
    config = parse(["--quick", "--bulk-texts", "50", "--baselines", "none", "--compare", "tei=http://h:1,http://h:2"])
    assert config.quick and config.bulk_texts == 50 and config.latency_requests == 7
    assert config.latency_lengths == QUICK["latency_lengths"] and config.baselines == ()
    assert config.compare == ("tei=http://h:1", "http://h:2")


def test_environment_booleans_and_bad_values(monkeypatch):
    monkeypatch.setenv("QUIVER_BENCH_PROGRESS", "0")
    assert parse([]).progress is False
    with pytest.raises(ValueError, match="--api"):
        parse(["--api", "grpc"])
    with pytest.raises(ValueError, match="--baselines"):
        parse(["--baselines", "vllm"])
